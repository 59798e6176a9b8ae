"""A TRL preference trainer run inside our run (``algorithm.backend: trl``; ``rlexp.runs.training`` dispatches here).

``rlexp.runs.training.run`` does what it does for GRPO — config checks, the run-directory lock, provenance
(config.yaml, provenance.json), the run identity (run.json), the end-of-run summary — and hands this module the
building and the training: ``PreferenceRun`` has the ``restore`` / ``train`` / ``finished`` of
``rlexp.trainer.loop.Trainer``.

Built from our groups: the model and tokenizer (``model=``, ``rlexp.models.loading.load_model``; its chat template
is the one TRL applies to conversational data), the data (``dataset=``: a preference set of
``rlexp.preference.data``, our own scored rollouts of ``rlexp.preference.own_rollouts``, or — online DPO — the prompt
dataset's records, whose reward our reward terms give), our optimiser (``optimizer=``, handed to TRL with a
constant learning rate after ``trainer.warmup_steps`` of linear warm-up, as ours), and TRL's config from our
trainer settings:

==============================  ===========================================================================
ours                            TRL / transformers
==============================  ===========================================================================
trainer.max_steps               max_steps (one step = one optimiser step: our step)
trainer.prompts_per_step        examples per step: pairs (DPO, ORPO), labelled completions (KTO), prompts
                                (online DPO, 2 samples each) = per_device_train_batch_size × grad. accumulation
trainer.micro_batch_size        completions per forward: per_device_train_batch_size = its half for pairs
trainer.seed                    seed, data_seed
trainer.max_grad_norm           max_grad_norm (null: not clipped, the norm still logged)
trainer.checkpoint_every        save_steps (0: at the end only); checkpoints in <run dir>/checkpoints/checkpoint-N
trainer.keep_checkpoints        kept at the end (save_total_limit while training: 2 with fallback_checkpoint)
trainer.autocast                bf16 / fp16 (auto: as our trainer decides, rlexp.trainer.loop.resolve_autocast)
trainer.max_new_tokens,         online DPO's max_new_tokens, temperature
trainer.temperature
algorithm.beta, loss_type       beta, loss_type (online DPO: beta=[β])
algorithm.options               any further field of the TRL config, as is
==============================  ===========================================================================

Metrics: a ``TrainerCallback`` forwards each TRL log (``logging_steps=1``) to our trackers and ``metrics.jsonl`` in
our names (``rlexp.preference.metrics``), plus ``time/step_s``, the pair counts (``pref/pairs``, ...), the greedy
held-out evaluation (``eval/accuracy`` at step 0, every ``trainer.eval_every`` and at the end, on the prompt
dataset's held-out split) and, for online DPO, each reward term's mean (``reward/<term>/mean``, ``accuracy``).

Resume after a kill: ``trainer.resume`` continues from the newest ``checkpoint-N`` (transformers restores the
weights, the optimiser, the scheduler, the RNG states and skips the data already seen); steps up to the last one in
``metrics.jsonl`` are recomputed but not logged again, and the trackers are back-filled from ``metrics.jsonl``
(a kill between the JSONL write and the tracker's); the trackers continue the runs of ``tracker_ids.json``."""

from __future__ import annotations

import copy
import json
import logging
import math
import re
import shutil
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlexp.preference.metrics import is_summary, translate

log = logging.getLogger("rlexp.preference")

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def is_trl_backed(cfg: DictConfig) -> bool:
    return isinstance(cfg.get("algorithm"), DictConfig) and cfg.algorithm.get("backend") == "trl"


def trl_checkpoints(root: Path) -> list[Path]:
    """transformers' complete checkpoints under ``root`` (``checkpoint-N`` holding trainer_state.json), newest
    first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := CHECKPOINT.match(p.name)) and (p / "trainer_state.json").exists()
    ]
    return [p for _, p in sorted(found, reverse=True)]


def find_trl_checkpoint(run_dir: Path) -> Path | None:
    found = trl_checkpoints(Path(run_dir) / "checkpoints")
    return found[0] if found else None


def _batch_shape(examples: int, per_forward: int) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps) with their product ``examples``: the largest
    divisor of ``examples`` up to ``per_forward``."""
    per_forward = max(1, min(per_forward, examples))
    while examples % per_forward:
        per_forward -= 1
    return per_forward, examples // per_forward


def _make_callback(run: PreferenceRun):
    from transformers import TrainerCallback

    class Forward(TrainerCallback):
        def __init__(self):
            self.t0 = time.perf_counter()
            self.eval_metrics: dict = {}

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step = state.global_step
            run.step_time = time.perf_counter() - self.t0
            s = run.s
            if run.evaluator is not None and ((s.eval_every and step % s.eval_every == 0) or step == s.max_steps):
                self.eval_metrics = run.evaluate(step)
            if run.stopper.requested:
                run.stopper.step_ended()
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or is_summary(logs):
                return control
            step = state.global_step
            metrics = {**run.translate(logs), **run.extra_metrics(), **self.eval_metrics}
            ev, self.eval_metrics = self.eval_metrics, {}
            run.log_step(step, metrics, ev)
            stop = False
            for cb in run.callbacks:
                stop |= bool(cb.on_step_end(step, metrics, ev))
            if stop:
                run.result.stopped_early = True
                control.should_save = True
                control.should_training_stop = True
            loss = metrics.get("loss/total")
            if loss is not None and not math.isfinite(loss):
                raise FloatingPointError(f"step {step}: non-finite loss {loss}")
            return control

    return Forward()


def reward_function(reward_terms: dict, stats: dict):
    """Our reward terms as one TRL reward function (online DPO): the weighted sum of the terms, each completion
    scored with its dataset record (the ``record`` column, JSON). The terms' means are added to ``stats``."""
    from rlexp.rewards.terms import Sample

    def rlexp_reward(prompts, completions, completion_ids=None, record=None, **_):
        records = [json.loads(r) for r in record]
        samples = [
            Sample(
                p if isinstance(p, str) else str(p),
                c if isinstance(c, str) else c[-1]["content"],
                rec,
                i,
                len(completion_ids[i]) if completion_ids is not None else 0,
                False,
                list(completion_ids[i]) if completion_ids is not None else None,
            )
            for i, (p, c, rec) in enumerate(zip(prompts, completions, records))
        ]
        total = [0.0] * len(samples)
        for name, term in reward_terms.items():
            res = term(samples)
            for i, v in enumerate(res.scores):
                total[i] += term.weight * float(v)
            stats.setdefault(f"reward/{name}/mean", []).append(sum(res.scores) / max(1, len(res.scores)))
        return total

    return rlexp_reward


class PreferenceRun:
    """Our run around a TRL preference trainer (module docstring)."""

    translate = staticmethod(translate)  # TRL's log names -> ours (the SFT stage's run, rlexp.sft, has its own)

    def __init__(self, cfg: DictConfig, t, device, run_dir: Path, callbacks: list, tags: dict, identity):
        from rlexp.models.loading import load_model
        from rlexp.preference.own_rollouts import OwnRollouts, wrap_prompts
        from rlexp.runs.setup import build, build_reward_term, build_trackers
        from rlexp.runs.training import make_evaluator
        from rlexp.tracking.params import flatten
        from rlexp.trainer.loop import TrainResult
        from rlexp.trainer.stopping import GracefulStop

        self.cfg, self.s, self.device, self.run_dir = cfg, t, device, Path(run_dir)
        self.callbacks = list(callbacks)
        self.method = build(cfg.algorithm, "algorithm", _convert_="all")
        data = build(cfg.dataset, "dataset")
        from rlexp.data.sources import DatasetSplits

        if isinstance(data, DatasetSplits) and self.method.trainer != "online_dpo":
            data = wrap_prompts(data, t.num_generations, t.seed)
        self.data = data
        self.prompt_format = build(cfg.prompt, "prompt")
        self.reward_terms = {n: build_reward_term(term, f"reward.terms.{n}") for n, term in cfg.reward.terms.items()}
        self.rollout = build(cfg.rollout, "rollout")
        loaded = load_model(cfg.model, device)
        self.model, self.tok = loaded.model, loaded.tokenizer
        self.optimizer = build(cfg.optimizer, "optimizer")([p for p in self.model.parameters() if p.requires_grad])
        self.tracker, self.jsonl = build_trackers(cfg, self.run_dir)
        container = OmegaConf.to_container(cfg, resolve=True)
        self.config, self.params = container, flatten(container)
        self.tags = {**tags, **identity.tags()}
        self.continue_tracker_runs = identity.continues
        self.run_name = cfg.run_name or self.run_dir.name
        prompt_records = isinstance(data, (DatasetSplits, OwnRollouts))
        self.evaluator = make_evaluator(cfg, data, self.prompt_format, self.rollout) if prompt_records else None
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.finished: str | None = None
        self._restored = None  # (step, checkpoint path or None)
        self.stopper = GracefulStop(None)
        self.result = TrainResult(0)
        self.step_time = 0.0
        self.pair_counts: dict = {}
        self.reward_stats: dict = {}
        self.last_logged = 0

    # ---- resume --------------------------------------------------------------------------------
    def restore(self) -> int:
        """The newest transformers checkpoint of the run directory (``trainer.resume``); the step it holds."""
        from rlexp.trainer.checkpoint import CheckpointError

        if self._restored is not None:
            return self._restored[0]
        path = find_trl_checkpoint(self.run_dir) if self.s.resume else None
        step = 0
        if path is not None:
            step = int(json.loads((path / "trainer_state.json").read_text())["global_step"])
            log.info("Resuming from %s at step %d", path, step)
        elif self.s.resume and self.jsonl.path.exists() and self.jsonl.last_step() > 0:
            raise CheckpointError(
                f"{self.run_dir} already holds logged steps but no checkpoint to resume from; train in a new run "
                "directory (hydra.run.dir=<dir>)"
            )
        self._restored = (step, path)
        return step

    # ---- metrics -------------------------------------------------------------------------------
    def extra_metrics(self) -> dict:
        out = {"time/step_s": self.step_time, **self.pair_counts}
        for key, values in self.reward_stats.items():
            if values:
                out[key] = sum(values) / len(values)
        acc = self.s.accuracy_term
        if acc and f"reward/{acc}/mean" in out:
            out["accuracy"] = out[f"reward/{acc}/mean"]
        self.reward_stats.clear()
        return out

    def log_step(self, step: int, metrics: dict, eval_metrics: dict) -> None:
        if step > self.last_logged:  # a resumed run recomputes the steps after its checkpoint: log each once
            self.jsonl.log_metrics(metrics, step)
            self.tracker.log_metrics(metrics, step)
        self.result.last_step, self.result.metrics = step, metrics
        if eval_metrics:
            self.result.eval_metrics = eval_metrics

    def evaluate(self, step: int) -> dict:
        from rlexp.trainer.metrics import with_accuracy_gain

        return with_accuracy_gain(self.evaluator(self.model, self.tok, step), self.jsonl.path)

    # ---- training ------------------------------------------------------------------------------
    def train(self):
        from rlexp.trainer.stopping import GracefulStop

        with GracefulStop(self.s.stop_grace_s) as self.stopper:
            return self._train()

    def _train(self):
        self.restore()
        start_step, path = self._restored
        tracker_ids = self._saved_tracker_ids() if self.continue_tracker_runs else None
        ids = self.tracker.start(self.run_name, self.config, self.params, self.tags, tracker_ids)
        status = "FAILED"
        try:
            self._save_tracker_ids(ids)
            if not tracker_ids:
                for name in ("config.yaml", "overrides.yaml", "provenance.json"):
                    if (self.run_dir / name).exists():
                        self.tracker.log_artifact(str(self.run_dir / name))
            self.jsonl.start(self.run_name, self.config, self.params, self.tags)
            self.last_logged = self.jsonl.last_step()
            if path is not None and self.last_logged > 0:
                from rlexp.tracking.base import read_jsonl

                self.tracker.backfill(read_jsonl(self.jsonl.path))
            self.result.last_step = start_step
            if self.evaluator is not None and self.s.eval_at_start and start_step == 0 and not self.jsonl.has_step(0):
                metrics = self.evaluator(self.model, self.tok, 0)
                self.jsonl.log_metrics(metrics, 0)
                self.tracker.log_metrics(metrics, 0)
            trainer = self.build_trainer()
            trainer.train(resume_from_checkpoint=str(path) if path is not None else None)
            if self.stopper.requested and self.result.last_step < self.s.max_steps:
                from rlexp.trainer.stopping import RunStopped

                raise RunStopped(self.stopper.signum, self.result.last_step, checkpointed=True)
            self.prune(self.s.keep_checkpoints)
            status = "FINISHED"
            return self.result
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) or self.stopper.requested:
                status = "KILLED"
            raise
        finally:
            self.finish(status)

    def finish(self, status: str) -> None:
        from rlexp.tracking.provenance import finish_provenance

        prov = self.run_dir / "provenance.json"
        if prov.exists():
            finish_provenance(self.run_dir, status)
            self.tracker.log_artifact(str(prov))
        self.tracker.finish(status)
        self.finished = status

    def prune(self, keep: int) -> None:
        for stale in trl_checkpoints(self.ckpt_dir)[max(keep, 0) :]:
            shutil.rmtree(stale, ignore_errors=True)

    def _saved_tracker_ids(self):
        p = self.run_dir / "tracker_ids.json"
        return json.loads(p.read_text()) if p.exists() else None

    def _save_tracker_ids(self, ids) -> None:
        (self.run_dir / "tracker_ids.json").write_text(json.dumps(ids))

    # ---- the TRL trainer -----------------------------------------------------------------------
    def train_rows(self) -> list[dict]:
        """TRL's dataset rows for this method (pairs from our rollouts are built, or read from their cache, here)."""
        from rlexp.data.sources import DatasetSplits
        from rlexp.preference.own_rollouts import OwnRollouts

        kind = self.method.data_kind
        if kind == "prompts":  # online DPO: our prompts, rendered with our format; the record for the reward
            records = self.data.train if isinstance(self.data, (DatasetSplits, OwnRollouts)) else None
            if records is None:
                from rlexp.config.schema import ConfigError

                raise ConfigError(
                    f"algorithm={self.method.name}: online DPO samples and scores with our reward terms, which need "
                    "a prompt dataset with answers (dataset=arithmetic_add_sub, gsm8k, own_rollouts, ...), not "
                    f"the preference set {getattr(self.data, 'name', '?')}"
                )
            return [
                {"prompt": self.prompt_format.render(self.tok, r["question"]), "record": json.dumps(r)} for r in records
            ]
        data = self.data
        if isinstance(data, OwnRollouts):
            data, self.pair_counts = data.build(
                self.model, self.tok, self.prompt_format, self.rollout, self.reward_terms, self.run_dir
            )
        rows = data.rows(kind)
        keep = ("prompt", "chosen", "rejected") if kind == "paired" else ("prompt", "completion", "label")
        return [{k: r[k] for k in keep} for r in rows]

    def trl_config(self, cls, examples_per_forward: int, **specific):
        from dataclasses import fields

        from rlexp.config.schema import ConfigError
        from rlexp.trainer.loop import resolve_autocast

        s = self.s
        per_device, accumulation = _batch_shape(s.prompts_per_step, examples_per_forward)
        dtype = resolve_autocast(s.autocast, next(self.model.parameters()))
        import torch

        lr = float(self.cfg.optimizer.lr)
        kwargs = dict(
            output_dir=str(self.ckpt_dir),
            max_steps=s.max_steps,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=accumulation,
            learning_rate=lr,
            lr_scheduler_type="constant_with_warmup" if s.warmup_steps else "constant",
            warmup_steps=s.warmup_steps,
            max_grad_norm=s.max_grad_norm if s.max_grad_norm else float("inf"),
            logging_steps=1,
            save_strategy="steps",
            save_steps=s.checkpoint_every or s.max_steps,
            save_total_limit=max(s.keep_checkpoints, 2 if s.fallback_checkpoint else 1),
            seed=s.seed,
            data_seed=s.seed,
            report_to=[],
            disable_tqdm=not s.progress,
            use_cpu=self.device.type == "cpu",
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            gradient_checkpointing=False,
            dataloader_num_workers=0,
            **specific,
        )
        if getattr(self.method, "beta", None) is not None:  # the preference methods' β (the SFT stage has none)
            kwargs["beta"] = self.method.beta
        if self.method.loss_type is not None:
            kwargs["loss_type"] = self.method.loss_type
        known = {f.name for f in fields(cls)}
        for key, value in self.method.options.items():
            if key not in known:
                raise ConfigError(f"algorithm.options.{key} is not a field of TRL's {cls.__name__}")
            kwargs[key] = value
        return cls(**kwargs)

    def build_trainer(self):
        m = self.method.trainer
        rows = self.train_rows()
        from datasets import Dataset

        dataset = Dataset.from_list(rows)
        callbacks = [_make_callback(self)]
        optimizers = (self.optimizer, None)  # transformers adds the (constant) schedule on our optimiser
        pair_forward = max(1, self.s.micro_batch_size // 2) if self.s.micro_batch_size else self.s.prompts_per_step
        common = dict(train_dataset=dataset, processing_class=self.tok, callbacks=callbacks, optimizers=optimizers)
        if m == "dpo":
            from trl import DPOConfig, DPOTrainer

            args = self.trl_config(DPOConfig, pair_forward)
            trainer = DPOTrainer(model=self.model, ref_model=self.reference(), args=args, **common)
        elif m == "kto":
            from trl import KTOConfig, KTOTrainer

            args = self.trl_config(KTOConfig, self.s.micro_batch_size or self.s.prompts_per_step)
            trainer = KTOTrainer(model=self.model, ref_model=self.reference(), args=args, **common)
        elif m == "orpo":
            from trl.experimental.orpo import ORPOConfig, ORPOTrainer

            args = self.trl_config(ORPOConfig, pair_forward)
            trainer = ORPOTrainer(model=self.model, args=args, **common)
        else:
            from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

            args = self.trl_config(
                OnlineDPOConfig,
                pair_forward,
                max_new_tokens=self.s.max_new_tokens,
                temperature=self.s.temperature,
            )
            args.beta = [self.method.beta]
            trainer = OnlineDPOTrainer(
                model=self.model,
                ref_model=self.reference(),
                reward_funcs=[reward_function(self.reward_terms, self.reward_stats)],
                args=args,
                **common,
            )
            # TRL 1.16's beta property indexes its list by state.epoch, a float after the first step (TypeError):
            # one β for the whole run is the float itself, which the property returns as it is
            trainer._beta = float(self.method.beta)
        if not self.s.progress:
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            for cb in (PrinterCallback, ProgressCallback):
                trainer.remove_callback(cb)
        return trainer

    def reference(self):
        """The frozen reference: a copy of the initial policy (TRL would reload it from the hub by name)."""
        ref = copy.deepcopy(self.model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref


def build_run(cfg: DictConfig, t, device, run_dir: Path, callbacks: list, tags: dict, identity):
    """``rlexp.runs.training._build`` for a TRL-backed method: the run and its tracker."""
    run = PreferenceRun(cfg, t, device, run_dir, callbacks, tags, identity)
    for cb in callbacks:
        if hasattr(cb, "bind"):  # callbacks that need the trainer (tracker tags, run dir)
            cb.bind(run)
    return run, run.tracker
