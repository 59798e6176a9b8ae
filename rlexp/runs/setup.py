"""What every app does before it builds a model: threads, seeds and device; provenance; trackers; config nodes
instantiated with errors that name their key."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig


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


def release_device_memory(device: torch.device) -> None:
    """Hand a finished job's cached GPU memory back to the device. A sweep's joblib workers outlive their trials
    (loky keeps up to one process per core): on the H100 each kept ~8 GB of SmolLM2's cache after its trial, and
    the second round of a 6-job sweep ran out of memory (issue 30; the sweep then ran with
    hydra.launcher.n_jobs=6, which caps the workers)."""
    if device.type == "cuda" and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def resolve_device(name: str) -> torch.device:
    """``trainer.device``; ``auto``: CUDA when there is a GPU, unless ``accelerate launch --cpu`` started this
    process (it sets ``ACCELERATE_USE_CPU``)."""
    if name == "auto":
        cpu_launch = os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true"
        return torch.device("cuda" if torch.cuda.is_available() and not cpu_launch else "cpu")
    return torch.device(name)


def write_provenance(cfg: DictConfig, run_dir: Path) -> dict:
    """config.yaml, overrides.yaml and provenance.json in the run dir (see rlexp.tracking.provenance)."""
    from rlexp.tracking.provenance import write_provenance as write

    return write(cfg, run_dir)


def link_latest(run_dir: Path) -> None:
    """``outputs/latest`` -> the newest training run under ``./outputs`` (``eval.checkpoint=outputs/latest``).
    Only for run directories inside ``./outputs``; best effort (a file system without links: nothing)."""
    outputs = Path("outputs").resolve()
    run_dir = Path(run_dir).resolve()
    if outputs not in run_dir.parents:
        return
    link = outputs / "latest"
    tmp = outputs / f".latest-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(run_dir.relative_to(outputs), target_is_directory=True)
        os.replace(tmp, link)  # atomic: parallel runs never leave a broken link
    except OSError:
        tmp.unlink(missing_ok=True)


def build_trackers(cfg: DictConfig, run_dir: Path, main: bool = True):
    from rlexp.tracking.base import JSONLTracker, MultiTracker

    if not main:  # distributed=ddp: a process other than the main one logs nothing (rlexp.trainer.distributed)
        from rlexp.trainer.distributed import FollowerJSONL

        return MultiTracker([]), FollowerJSONL(run_dir / "metrics.jsonl")

    backends = [instantiate(b) for b in (cfg.tracker.get("backends") or {}).values()]
    return MultiTracker(backends), JSONLTracker(run_dir / "metrics.jsonl")


def build_scheduler(optimizer, warmup_steps: int, steps_per_train_step: int):
    """Linear warm-up over ``warmup_steps`` training steps, counted in optimiser steps (μ·k per training step)."""
    if warmup_steps <= 0:
        return None
    total = warmup_steps * steps_per_train_step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / total))


def build_reward_term(node, key: str):
    """A reward term from its config node; a ``_target_`` that is a plain function (TRL's reward-function
    convention, or ``fn(sample)``) is wrapped in ``rlexp.rewards.functions.FunctionReward``."""
    import inspect

    from hydra.utils import get_object
    from omegaconf import OmegaConf

    from rlexp.config.schema import ConfigError

    try:
        target = get_object(node._target_)
    except Exception as e:
        raise ConfigError(
            f"{key}._target_={node._target_!r} cannot be imported ({e}); a module in the working directory is "
            "importable when rlexp runs from that directory"
        ) from e
    if not inspect.isfunction(inspect.unwrap(target)):  # a RewardTerm class (or factory): Hydra builds it
        return build(node, key)
    from rlexp.rewards.functions import FunctionReward

    options = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "_target_"}
    try:
        return FunctionReward(target, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}: {e}") from e


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
