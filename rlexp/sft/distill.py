"""The distillation stage (``stage=distill``, conf/stage/distill.yaml): GKD, on-policy distillation ("On-Policy
Distillation of Language Models: Learning from Self-Generated Mistakes", Agarwal et al., ICLR 2024, arXiv 2306.13649)
through TRL 1.16's ``trl.experimental.gkd.GKDTrainer`` inside our run.

Why a stage of its own and not an option of ``stage=sft``: the loss is not SFT's (a divergence between the teacher's
and the student's whole next-token distributions, not the NLL of the completion), a teacher is required where the SFT
stage's optional ``algorithm.teacher`` only samples examples, and the SFT settings ``loss_type`` and
``completion_only_loss`` mean nothing here. It shares the rest with the SFT stage: ``DistillRun`` is ``SFTRun`` (the
examples of ``rlexp.sft.data``, the teacher loading, resume, logging, the held-out ``eval/accuracy``, the saved
``<run dir>/model``) with GKD's trainer, settings (``DistillMethod``) and metric names (``translate``). The node keeps
``backend: sft``, so ``rlexp.runs.training`` hands it to ``rlexp.sft.runner``, which builds a ``DistillRun`` for it.

GKD (the paper's Algorithm 1): each optimiser step draws u ~ U(0, 1); when u ≤ λ (``algorithm.lmbda``, the student
data fraction) the step's outputs are sampled from the student itself (on-policy: its own mistakes), otherwise they
are the dataset's outputs (our examples: the records' demonstrations, or a model's correct samples) — or, with
``algorithm.seq_kd``, sampled from the teacher. The teacher scores every token of those outputs and the loss is the
generalised Jensen-Shannon divergence JSD(β) between the teacher's and the student's token distributions (TRL's
``generalized_jsd_loss``: β = 0 forward KL(teacher‖student), β = 1 reverse KL), summed over the completion tokens
and divided by their number in the step.

Two changes to TRL's trainer, both toward the paper: TRL draws u per micro-batch in ``training_step``, after
transformers counted the step's label tokens (``num_items_in_batch``) on the dataset's labels, so a sampled micro-batch
was normalised by the wrong token count; here u is drawn once per optimiser step, the outputs are sampled for all of
the step's micro-batches before the count, and the count is taken on the tokens actually trained on
(``get_batch_samples``). The loss is TRL's ``generalized_jsd_loss``, unchanged.

Metrics (``translate``): ``distill/loss`` (the JSD, also ``loss/total``), ``distill/on_policy`` (1 when the step
trained on the student's samples), ``distill/teacher_sampled`` (1 when on the teacher's, ``seq_kd``),
``distill/token_agreement`` (share of completion tokens where the student's and the teacher's argmax agree),
``distill/teacher_nll`` (the teacher's mean NLL of the trained completion tokens: how likely it finds them),
``distill/completion_tokens`` (mean completion tokens per sequence), ``distill/generate_s``; the example counts
(``distill/examples``, ``distill/skipped``, ``distill/too_long``)."""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from rlexp.preference.metrics import SUMMARY_KEYS
from rlexp.sft.method import RESERVED_OPTIONS as SFT_RESERVED
from rlexp.sft.method import SOURCES, ExampleSettings, check_example_settings
from rlexp.sft.runner import SFTRun

log = logging.getLogger("rlexp.sft.distill")

TARGET = "rlexp.sft.distill.DistillMethod"
# GKDConfig fields rlexp sets from the node and the trainer settings
RESERVED_OPTIONS = SFT_RESERVED | {
    "lmbda",
    "beta",
    "temperature",
    "max_new_tokens",
    "seq_kd",
    "teacher_model_name_or_path",
    "teacher_model_init_kwargs",
}


def is_distill(node) -> bool:
    """Whether an algorithm node (a DictConfig or dict) is the distillation stage's."""
    return node is not None and str(node.get("_target_", "")) == TARGET


@dataclass
class DistillMethod(ExampleSettings):
    """Built from the algorithm node of ``stage=distill`` (``_target_``); ``DistillRun`` reads it. ``teacher`` (a
    model config name, conf/model/<name>.yaml, or a run / model directory) is required; ``data``: the dataset outputs
    of the off-policy steps (``own_samples``: the teacher's correct samples)."""

    lmbda: float = 0.5  # student data fraction λ (TRL GKDConfig.lmbda)
    beta: float = 0.5  # JSD(β) interpolation (TRL GKDConfig.beta): 0 forward KL, 1 reverse KL
    seq_kd: bool = False  # off-policy steps sample from the teacher instead of reading the dataset's outputs
    temperature: float | None = None  # the student's (and teacher's) sampling temperature; null: trainer.temperature
    name: str = "gkd"

    loss_type = None  # not a field: TRL's SFT loss type, which GKD does not use (PreferenceRun.trl_config reads it)

    def __post_init__(self):
        super().__post_init__()
        check_node({f.name: getattr(self, f.name) for f in fields(self)})


SETTINGS = tuple(f.name for f in fields(DistillMethod))


def check_node(node: dict) -> None:
    """Raise ``ConfigError`` naming the key of the first bad setting of a distillation node."""
    from rlexp.config.schema import ConfigError

    for key in node:
        if str(key).startswith("_"):
            continue
        if key not in SETTINGS:
            raise ConfigError(
                f"algorithm.{key} is not a setting of the distillation stage (stage=distill sets the whole algorithm "
                f"node: leave algorithm= out; its settings: "
                f"{', '.join(s for s in SETTINGS if s not in ('name', 'backend'))})"
            )
    get = lambda k: node.get(k, getattr(DistillMethod, k, None))
    teacher = get("teacher")
    if not isinstance(teacher, str) or not teacher.strip():
        raise ConfigError(
            f"algorithm.teacher={teacher!r}: GKD needs a teacher — a model config name (conf/model/<name>.yaml, e.g. "
            "smollm2_135m) or a run / model directory (an RL or SFT stage's <run dir>/model) sharing the student's "
            "tokenizer"
        )
    for key in ("lmbda", "beta"):
        value = get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise ConfigError(f"algorithm.{key}={value!r}: must be a number in [0, 1]")
    temperature = get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0
    ):
        raise ConfigError(f"algorithm.temperature={temperature!r}: must be > 0, or null (trainer.temperature)")
    if get("data") not in SOURCES:
        raise ConfigError(f"algorithm.data={get('data')!r}: one of {list(SOURCES)}")
    max_length = get("max_length")
    check_example_settings(get, max_length)
    options = node.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"algorithm.options={options!r}: a mapping of TRL GKDConfig fields")
    clash = sorted(RESERVED_OPTIONS & set(options))
    if clash:
        raise ConfigError(
            f"algorithm.options.{clash[0]}: set by rlexp (trainer.* / optimizer.lr / algorithm.lmbda, beta, seq_kd, "
            "temperature, max_length / algorithm.teacher), not through algorithm.options"
        )


# ---- the examples ------------------------------------------------------------------------------------------------
def tokenized_examples(rows: list[dict], tokenizer, max_length: int | None) -> tuple[list[dict], int]:
    """Our prompt-completion rows as token ids: ``prompt_ids`` (the rendered prompt, no special tokens added: the
    chat template has them) and ``completion_ids`` (the completion and the end-of-sequence token, as TRL's SFT
    appends it), cut to ``max_length`` tokens in all from the end of the completion. A row whose prompt alone fills
    ``max_length`` keeps no completion token and is left out; their number is returned with the examples."""
    eos = tokenizer.eos_token_id
    out, too_long = [], 0
    for r in rows:
        prompt = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        completion = tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + [eos]
        if max_length is not None:
            completion = completion[: max(0, max_length - len(prompt))]
        if not completion:
            too_long += 1
            continue
        out.append({"prompt_ids": prompt, "completion_ids": completion})
    return out, too_long


class PromptCompletionCollator:
    """A batch of ``tokenized_examples`` in the layout TRL's GKD trainer reads (that of its ``DataCollatorForChatML``):
    ``input_ids`` / ``attention_mask`` of prompt + completion, ``labels`` (-100 on the prompt and the padding), and
    the prompts alone (``prompts``, ``prompt_attention_mask``) for the on-policy samples; everything left-padded."""

    def __init__(self, pad_token_id: int):
        self.pad = int(pad_token_id)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        seqs = [list(e["prompt_ids"]) + list(e["completion_ids"]) for e in examples]
        width = max(len(s) for s in seqs)
        p_width = max(len(e["prompt_ids"]) for e in examples)
        n = len(examples)
        input_ids = torch.full((n, width), self.pad, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        labels = torch.full((n, width), -100, dtype=torch.long)
        prompts = torch.full((n, p_width), self.pad, dtype=torch.long)
        prompt_attention = torch.zeros((n, p_width), dtype=torch.long)
        for i, (e, s) in enumerate(zip(examples, seqs)):
            start = width - len(s)
            input_ids[i, start:] = torch.tensor(s)
            attention[i, start:] = 1
            c = len(e["completion_ids"])
            labels[i, width - c :] = torch.tensor(list(e["completion_ids"]))
            p = len(e["prompt_ids"])
            prompts[i, p_width - p :] = torch.tensor(list(e["prompt_ids"]))
            prompt_attention[i, p_width - p :] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": labels,
            "prompts": prompts,
            "prompt_attention_mask": prompt_attention,
        }


# ---- the trainer ---------------------------------------------------------------------------------------------------
def gkd_trainer_class():
    """TRL's GKDTrainer with the step's data source drawn once per optimiser step (module docstring) and our token
    statistics; built on first use (``trl.experimental`` is slow to import)."""
    from trl.experimental.gkd import GKDTrainer
    from trl.models.utils import unwrap_model_for_generation
    from trl.trainer.sft_trainer import SFTTrainer

    class StepGKDTrainer(GKDTrainer):
        source: str = "dataset"  # where the current step's outputs come from: dataset | student | teacher
        generate_s: float = 0.0

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
            self.generate_s = 0.0
            if not batches:
                return batches, num_items
            if random.random() <= self.lmbda:  # the paper's u ≤ λ (TRL's draw, from the same global generator)
                self.source = "student"
            else:
                self.source = "teacher" if self.seq_kd else "dataset"
            if self.source != "dataset":
                t0 = time.perf_counter()
                batches = [self._sampled(b) for b in batches]
                self.generate_s = time.perf_counter() - t0
                num_items = self._get_num_items_in_batch(batches, device)  # the tokens trained on
            self._metrics["train"]["on_policy"].append(float(self.source == "student"))
            self._metrics["train"]["teacher_sampled"].append(float(self.source == "teacher"))
            return batches, num_items

        def _sampled(self, batch: dict) -> dict:
            batch = self._prepare_inputs(batch)
            if self.source == "student":
                unwrap = unwrap_model_for_generation(
                    self.model_wrapped,
                    self.accelerator,
                    generation_kwargs=self.generation_kwargs,
                    gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
                )
            else:
                unwrap = unwrap_model_for_generation(
                    self.teacher_model, self.accelerator, generation_kwargs=self.generation_kwargs
                )
            with unwrap as model, torch.no_grad():
                ids, mask, labels = self.generate_on_policy_outputs(model, batch, self.generation_config)
            return {**batch, "input_ids": ids, "attention_mask": mask, "labels": labels}

        def training_step(self, model, inputs, num_items_in_batch=None):
            # the outputs were chosen in get_batch_samples: skip GKDTrainer's per-micro-batch draw
            return SFTTrainer.training_step(self, model, inputs, num_items_in_batch)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            student = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            self.teacher_model.eval()
            with torch.no_grad():
                teacher = self.teacher_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
            s_logits, t_logits = student.logits[:, :-1, :], teacher.logits[:, :-1, :]
            labels = inputs["labels"][:, 1:]  # the logits at i predict the token at i + 1
            loss = self.generalized_jsd_loss(
                student_logits=s_logits,
                teacher_logits=t_logits,
                labels=labels,
                beta=self.beta,
                num_items_in_batch=num_items_in_batch,
            )
            self._record_tokens(s_logits.detach(), t_logits, labels)
            return (loss, student) if return_outputs else loss

        @torch.no_grad()
        def _record_tokens(self, s_logits, t_logits, labels) -> None:
            mask = labels != -100
            n = int(mask.sum())
            stats = self._metrics["train"]
            stats["completion_tokens"].append(n / max(1, labels.shape[0]))
            if n == 0:
                return
            agree = (s_logits.argmax(-1) == t_logits.argmax(-1)) & mask
            stats["token_agreement"].append(float(agree.sum()) / n)
            nll = torch.nn.functional.cross_entropy(t_logits[mask].float(), labels[mask], reduction="mean")
            stats["teacher_nll"].append(float(nll))

    return StepGKDTrainer


# ---- metric names ------------------------------------------------------------------------------------------------
TRL_TO_OURS: dict[str, str] = {
    "loss": "distill/loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "epoch": "distill/epoch",
    "on_policy": "distill/on_policy",
    "teacher_sampled": "distill/teacher_sampled",
    "token_agreement": "distill/token_agreement",
    "teacher_nll": "distill/teacher_nll",
    "completion_tokens": "distill/completion_tokens",
}


def translate(logs: dict) -> dict[str, float]:
    """One GKD log dict in our names (``TRL_TO_OURS``; other keys as ``trl/<key>``); ``loss/total`` repeats
    ``distill/loss``. Non-numbers are left out, and so are non-finite values but the loss."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if key in SUMMARY_KEYS:
            continue
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(v) and key != "loss":
            continue
        out[TRL_TO_OURS.get(key, f"trl/{key}")] = v
    if "distill/loss" in out:
        out["loss/total"] = out["distill/loss"]
    return out


# ---- the run -----------------------------------------------------------------------------------------------------
class DistillRun(SFTRun):
    """``SFTRun`` with GKD's trainer (module docstring)."""

    translate = staticmethod(translate)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tags["stage"] = "distill"
        self.teacher_model = None
        self.trl_trainer = None

    def extra_metrics(self) -> dict:
        gen = float(getattr(self.trl_trainer, "generate_s", 0.0) or 0.0)
        return {**super().extra_metrics(), "time/step_s": self.step_time + gen, "distill/generate_s": gen}

    def train_rows(self) -> list[dict]:
        rows = super().train_rows()
        self.data_counts = {k.replace("sft/", "distill/", 1): v for k, v in self.data_counts.items()}
        return rows

    def load_teacher(self, spec: str):
        """The teacher, loaded once: a model config (``conf/model/<spec>.yaml``, with its own loader and dtype) or a
        run / model directory (the SFT stage's loading); frozen, in eval mode, checked to share the student's
        tokenizer (GKD compares the two distributions token by token)."""
        if self.teacher_model is not None:
            return self.teacher_model
        from rlexp.config.paths import CONF_DIR
        from rlexp.config.schema import ConfigError

        config = Path(CONF_DIR) / "model" / f"{spec}.yaml"
        if "/" not in spec and config.exists():
            from omegaconf import OmegaConf

            from rlexp.models.loading import load_model

            loaded = load_model(OmegaConf.load(config), self.device)
            if loaded.tokenizer.get_vocab() != self.tok.get_vocab():
                raise ConfigError(
                    f"algorithm.teacher={spec}: its tokenizer differs from the student's "
                    f"(model={self.cfg.model.name}); GKD compares next-token distributions over one vocabulary"
                )
            model = loaded.model
            log.info("GKD: the teacher is model=%s (%s)", spec, loaded.name)
        else:
            model = super().load_teacher(spec)
        if model.config.get_text_config().vocab_size != self.model.config.get_text_config().vocab_size:
            raise ConfigError(
                f"algorithm.teacher={spec}: vocabulary of {model.config.get_text_config().vocab_size} tokens, the "
                f"student's has {self.model.config.get_text_config().vocab_size}; GKD needs one vocabulary"
            )
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.teacher_model = model
        return model

    def build_trainer(self):
        from datasets import Dataset
        from trl.experimental.gkd import GKDConfig

        from rlexp.config.schema import ConfigError

        if not self.s.progress:
            from datasets.utils.logging import disable_progress_bar

            disable_progress_bar()
        m = self.method
        examples, too_long = tokenized_examples(self.train_rows(), self.tok, m.max_length)
        self.data_counts["distill/too_long"] = float(too_long)
        if not examples:
            raise ConfigError(
                f"algorithm.max_length={m.max_length}: every prompt fills it, no completion token is left to train on"
            )
        args = self.trl_config(
            GKDConfig,
            self.s.micro_batch_size or self.s.prompts_per_step,
            max_length=m.max_length,
            lmbda=float(m.lmbda),
            seq_kd=bool(m.seq_kd),
            temperature=float(m.temperature if m.temperature is not None else self.s.temperature),
            max_new_tokens=self.s.max_new_tokens,
        )
        from rlexp.preference.runner import _make_callback

        trainer = gkd_trainer_class()(
            model=self.model,
            teacher_model=self.load_teacher(m.teacher),
            args=args,
            data_collator=PromptCompletionCollator(self.tok.pad_token_id),
            train_dataset=Dataset.from_list(examples),
            processing_class=self.tok,
            callbacks=[_make_callback(self)],
            optimizers=(self.optimizer, None),
        )
        if not self.s.progress:
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            for cb in (PrinterCallback, ProgressCallback):
                trainer.remove_callback(cb)
        self.trl_trainer = trainer
        return trainer
