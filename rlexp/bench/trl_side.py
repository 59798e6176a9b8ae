"""The TRL side of `rlexp bench`: everything that imports ``trl`` or ``datasets`` lives here.

TRL's ``GRPOTrainer`` (1.16) runs through its own ``train()`` loop, unmodified, on the bench's setting.
The harness interleaves it with our trainer through a ``TrainerCallback``: after TRL's optimiser step
(``on_step_end``) the callback runs one step of our trainer, then hands control back to TRL's loop.
A subclass adds timers around two methods and records what they return; nothing else changes.

What each phase of a TRL step covers (wall time; on CUDA the device is synchronised at every boundary):

* ``generate``: ``GRPOTrainer._generate`` — chat-template tokenisation of the conversational prompts,
  left padding, ``model.generate`` (sampling), masking after the first EOS, decoding, length metrics.
* ``score``: ``GRPOTrainer._calculate_rewards`` — the reward function (our ``Accuracy`` term behind
  TRL's reward-function signature, see ``AccuracyReward``) on every completion, and the gather.
* ``train``: ``on_step_begin`` → ``on_step_end`` minus generate and score — the rest of
  ``_generate_and_score_completions`` (padding, advantages, metrics, shuffle/split into micro-batches),
  forward + backward of every micro-batch (``_compute_loss``), gradient clipping, ``optimizer.step``,
  the (constant) LR scheduler step and ``zero_grad``.
* ``other``: from the end of the previous step (the callback returning) to ``on_step_begin`` — the
  log/save/evaluate checks of the transformers loop and fetching the next batch from the dataloader.

The step time is ``other + generate + score + train``: the wall time from the end of the previous step
to ``on_step_end``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from rlexp.rewards.terms import RewardTerm, Sample


class AccuracyReward:
    """Our reward term behind TRL's reward-function signature. TRL passes the dataset's other
    columns as keyword arguments: ``record`` is the JSON of the bench record the prompt came from."""

    def __init__(self, term: RewardTerm):
        self.term = term
        self._records: dict[str, dict] = {}

    def _record(self, text: str) -> dict:
        if text not in self._records:
            self._records[text] = json.loads(text)
        return self._records[text]

    def __call__(self, prompts, completions, completion_ids, record, **kwargs) -> list[float]:
        samples = []
        for p, c, ids, rec in zip(prompts, completions, completion_ids, record, strict=True):
            text = c[-1]["content"] if isinstance(c, list) else c
            prompt = p[-1]["content"] if isinstance(p, list) else p
            samples.append(Sample(prompt, text, self._record(rec), 0, len(ids), False))
        return self.term(samples).scores


class TimedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the generate and score phases timed and their outputs recorded."""

    bench_sync: Callable[[], None] = staticmethod(lambda: None)

    def _bench_reset(self) -> None:
        self.bench_phase: dict[str, float] = defaultdict(float)
        self.bench_tokens = 0
        self.bench_rows = 0
        self.bench_max_length = 0
        self.bench_rewards: list[float] = []
        self.bench_prompt_ids: list[list[int]] = []

    def _generate(self, prompts):
        self.bench_sync()
        t = time.perf_counter()
        out = super()._generate(prompts)
        self.bench_sync()
        self.bench_phase["generate"] += time.perf_counter() - t
        prompt_ids, completion_ids = out[0], out[1]
        self.bench_tokens += sum(len(c) for c in completion_ids)
        self.bench_rows += len(completion_ids)
        self.bench_max_length = max([self.bench_max_length, *map(len, completion_ids)])
        self.bench_prompt_ids.extend(list(map(int, p)) for p in prompt_ids)
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self.bench_sync()
        t = time.perf_counter()
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.bench_sync()
        self.bench_phase["score"] += time.perf_counter() - t
        self.bench_rewards.extend(torch.nansum(out, dim=1).tolist())
        return out


def bench_dataset(records: list[dict], prompt_format) -> Dataset:
    """Conversational prompts (system + user messages, rendered by TRL with the tokenizer's chat
    template) in exactly the order given: the harness passes the order our sampler draws, and TRL
    runs with ``shuffle_dataset=False``, so step k of both trainers sees the same prompts."""
    return Dataset.from_list(
        [{"prompt": prompt_format.messages(r["question"]), "record": json.dumps(r)} for r in records]
    )


def grpo_config(
    *,
    output_dir: str,
    device: torch.device,
    n_rows: int,
    micro_batch: int,
    num_generations: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    lr: float,
    betas,
    weight_decay: float,
    adam_eps: float,
    max_grad_norm: float | None,
    eps_low: float,
    eps_high: float,
    total_steps: int,
    seed: int,
    bf16: bool,
    gradient_checkpointing: bool,
    optim: str,
    scale_rewards: str,
    reward_weight: float = 1.0,
    torch_compile: bool = False,
    cache_implementation: str | None = None,
) -> GRPOConfig:
    """The GRPOConfig of the bench: one generation batch of ``n_rows`` = prompts × G per optimiser
    step (gradient accumulation over ``n_rows / micro_batch`` micro-batches), μ = 1, β = 0, the
    per-sequence token-mean loss (``loss_type="grpo"``), a constant LR, no logging or saving."""
    if n_rows % micro_batch:
        raise ValueError(f"trainer.micro_batch_size={micro_batch} must divide prompts × G = {n_rows} for TRL")
    ga = n_rows // micro_batch
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=device.type == "cpu",
        bf16=bf16,
        fp16=False,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=ga,
        steps_per_generation=ga,
        num_generations=num_generations,
        num_iterations=1,
        max_completion_length=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        beta=0.0,
        loss_type="grpo",
        scale_rewards=scale_rewards,
        reward_weights=[reward_weight],
        epsilon=eps_low,
        epsilon_high=eps_high,
        learning_rate=lr,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_epsilon=adam_eps,
        weight_decay=weight_decay,
        optim=optim,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=max_grad_norm if max_grad_norm else 0.0,
        max_steps=total_steps,
        shuffle_dataset=False,
        seed=seed,
        gradient_checkpointing=gradient_checkpointing,
        logging_steps=10**9,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        torch_compile=torch_compile,
        cache_implementation=cache_implementation,
    )


class _Interleave(TrainerCallback):
    def __init__(self, side: TRLSide, meter, after_step: Callable[[int], None]):
        self.side, self.meter, self.after_step = side, meter, after_step
        self.t_begin = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.meter.sync()
        self.t_begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        step_s, mem = self.meter.stop()
        tr = self.side.trainer
        gen, sc = tr.bench_phase["generate"], tr.bench_phase["score"]
        in_step = self.meter.t_stop - self.t_begin
        self.side.records.append(
            {
                "step": state.global_step,
                "generate_s": gen,
                "score_s": sc,
                "train_s": in_step - gen - sc,
                "step_s": step_s,
                "completion_tokens": tr.bench_tokens,
                "completions": tr.bench_rows,
                "max_length": tr.bench_max_length,
                "reward_mean": sum(tr.bench_rewards) / max(len(tr.bench_rewards), 1),
                **mem,
            }
        )
        if self.side.log_step is not None:
            self.side.log_step("trl", self.side.records[-1])
        self.side.prompt_ids.append(tr.bench_prompt_ids)
        self.after_step(state.global_step)
        tr._bench_reset()
        self.meter.start()


class _SkipNonFiniteUpdate(TrainerCallback):
    """Skip TRL's optimiser step when its gradients are not finite (as AMP's GradScaler does), so a
    NaN backward does not turn the weights into NaN and crash the next sampling step. TRL has no such
    guard; on an H100 with torch 2.11, bf16, 16 × 8 × 256, its SDPA backward returned NaN gradients
    (fully masked left-padding query rows — the case ``rlexp.core.forward.padded_causal_mask``
    fixes on our side). Costs one gradient-norm reduction per step; skipped steps are counted
    in the report."""

    def __init__(self, side: TRLSide):
        self.side = side

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if grads and not bool(torch.isfinite(torch.nn.utils.get_total_norm(grads))):
            for p in model.parameters():
                p.grad = None
            self.side.skipped_steps.append(state.global_step + 1)


class TRLSide:
    """TRL's GRPOTrainer on the bench's setting. ``run(total_steps, after_step, meter)`` runs
    ``trainer.train()``; after each of TRL's optimiser steps it calls ``after_step(k)``."""

    def __init__(
        self,
        *,
        model,
        tokenizer,
        records: list[dict],
        prompt_format,
        reward_term: RewardTerm,
        config: GRPOConfig,
        skip_nonfinite_steps: bool = True,
    ):
        self.config = config
        self.skip_nonfinite_steps = skip_nonfinite_steps
        self.trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=[AccuracyReward(reward_term)],
            args=config,
            train_dataset=bench_dataset(records, prompt_format),
            processing_class=tokenizer,
        )
        self.trainer._bench_reset()
        self.records: list[dict[str, Any]] = []
        self.prompt_ids: list[list[list[int]]] = []  # per step: the prompt tokens of every completion
        self.log_step: Callable[[str, dict], None] | None = None
        self.skipped_steps: list[int] = []  # TRL steps whose non-finite gradients were not applied

    def run(
        self, after_step: Callable[[int], None], meter, log_step: Callable[[str, dict], None] | None = None
    ) -> list[dict]:
        self.log_step = log_step
        self.trainer.bench_sync = meter.sync
        if self.skip_nonfinite_steps:
            self.trainer.add_callback(_SkipNonFiniteUpdate(self))
        self.trainer.add_callback(_Interleave(self, meter, after_step))
        meter.start()
        self.trainer.train()
        return self.records


def versions() -> dict[str, str]:
    import datasets
    import trl

    return {"trl": trl.__version__, "datasets": datasets.__version__}
