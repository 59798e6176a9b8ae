"""`rlexp train` (also `python -m rlexp.train`): the Hydra train app.

Composes model, dataset, prompt, reward, algorithm, rollout, tracker and optimizer groups with the
trainer.* settings, validates them, and runs the training loop. Returns the final metrics (the
Optuna sweeper reads its objective from them).
"""
from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import register, validate

log = logging.getLogger("rlexp.train")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
register()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def prepare_process(t) -> torch.device:
    """Threads, every RNG seeded from ``t.seed``, and the device of ``t.device`` (train, eval, bench)."""
    if t.num_threads:
        torch.set_num_threads(t.num_threads)
    seed_everything(t.seed)
    return resolve_device(t.device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def flatten(d, prefix="") -> dict[str, str]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, (int, float, bool, str)) or v is None else json.dumps(v)
    return out


def write_provenance(cfg: DictConfig, run_dir: Path) -> dict:
    """config.yaml, overrides.yaml and provenance.json in the run dir (see rlexp.tracking.provenance)."""
    from rlexp.tracking.provenance import write_provenance as write
    return write(cfg, run_dir, code_dir=str(Path(__file__).resolve().parent))


def build_trackers(cfg: DictConfig, run_dir: Path):
    from rlexp.tracking.base import JSONLTracker, MultiTracker
    backends = [instantiate(b) for b in (cfg.tracker.get("backends") or {}).values()]
    return MultiTracker(backends), JSONLTracker(run_dir / "metrics.jsonl")


def build_scheduler(optimizer, warmup_steps: int, mu: int):
    if warmup_steps <= 0:
        return None
    total = warmup_steps * mu
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / total))


def make_evaluator(cfg: DictConfig, data, prompt_format, rollout, consistency=None):
    """Greedy accuracy on the held-out split (``eval.size`` prompts) and, with ``+benchmark=<entry>``,
    the benchmarks (``rlexp.evaluation.runner.training_evaluator``); run every trainer.eval_every steps."""
    evaluators = []
    if cfg.eval.size > 0:
        from rlexp.evaluation.greedy import GreedyEvaluator
        evaluators.append(GreedyEvaluator(data.eval[: cfg.eval.size], prompt_format, rollout, cfg.trainer.accuracy_term and
                                          instantiate(cfg.reward.terms[cfg.trainer.accuracy_term]),
                                          max_new_tokens=cfg.eval.max_new_tokens))
    if cfg.get("benchmark"):
        from rlexp.evaluation.runner import training_evaluator
        evaluators.append(training_evaluator(cfg, data, rollout, consistency))
    if len(evaluators) <= 1:
        return evaluators[0] if evaluators else None
    return lambda model, tok, step: {k: v for e in evaluators for k, v in e(model, tok, step).items()}


def build(node, key: str, **kwargs):
    """``hydra.utils.instantiate`` that reports a failure as one message naming the config key and
    the original error (Hydra wraps it in InstantiationException)."""
    from hydra.errors import InstantiationException
    from rlexp.config.schema import ConfigError
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__ or e
        if isinstance(cause, (ValueError, FileNotFoundError, KeyError, TypeError)):
            raise ConfigError(f"{key}: {cause}") from cause
        raise


def run(cfg: DictConfig, callbacks: list | None = None):
    """Build everything from a composed config and train. Returns ``TrainResult``."""
    from rlexp.models.loading import load_model
    from rlexp.tracking.provenance import finish_provenance, run_tags
    from rlexp.trainer.loop import Trainer
    validate(cfg)
    from rlexp.sweeping.callback import sweep_callbacks  # a job of an Optuna sweep reports to its trial
    callbacks = [*(callbacks or []), *sweep_callbacks(cfg)]
    t = cfg.trainer
    device = prepare_process(t)
    run_dir = Path(t.run_dir)
    prov = write_provenance(cfg, run_dir)
    data = build(cfg.dataset, "dataset")
    prompt_format = build(cfg.prompt, "prompt")
    reward_terms = {name: build(term, f"reward.terms.{name}") for name, term in cfg.reward.terms.items()}
    algorithm = build(cfg.algorithm, "algorithm", _convert_="all")
    rollout = build(cfg.rollout, "rollout")
    loaded = load_model(cfg.model, device)
    optimizer = build(cfg.optimizer, "optimizer")(loaded.model.parameters())
    scheduler = build_scheduler(optimizer, t.warmup_steps, t.num_iterations)
    tracker, jsonl = build_trackers(cfg, run_dir)
    from rlexp.evaluation.consistency import meter_from_config
    consistency = meter_from_config(cfg.consistency) if "consistency" in cfg else None
    container = OmegaConf.to_container(cfg, resolve=True)
    tags = run_tags(cfg, prov, run_dir)
    trainer = Trainer(
        settings=t, model=loaded.model, tokenizer=loaded.tokenizer, algorithm=algorithm, reward_terms=reward_terms,
        rollout=rollout, data=data, prompt_format=prompt_format, optimizer=optimizer, scheduler=scheduler,
        tracker=tracker, jsonl=jsonl, run_dir=run_dir, run_name=cfg.run_name or run_dir.name, config=container,
        params=flatten(container), tags=tags, accuracy_term=t.accuracy_term,
        evaluator=make_evaluator(cfg, data, prompt_format, rollout, consistency), callbacks=callbacks,
        consistency=consistency)
    for cb in callbacks:
        if hasattr(cb, "bind"):  # callbacks that need the trainer (tracker tags, run dir)
            cb.bind(trainer)
    status = "FAILED"
    try:
        result = trainer.train()
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        finish_provenance(run_dir, status)
    log.info("done: step %d  %s", result.last_step,
             {k: round(v, 4) for k, v in result.metrics.items() if k in ("reward/mean", "accuracy", "length/mean")})
    return result


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig):
    result = run(cfg)
    return {**result.metrics, **result.eval_metrics}


if __name__ == "__main__":
    main()
