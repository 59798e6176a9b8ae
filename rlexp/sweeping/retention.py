"""Disk retention of a sweep: by default only the best trial's weights stay (``hydra.sweeper.keep_weights``).

Every trial trains with its own ``checkpoints/`` (a 1.6 GB full checkpoint for SmolLM2-135M; a 24-trial sweep
would keep ~38 GB). Once a trial has finished, the checkpoints of every finished trial that is not the best
(single objective) or on the Pareto front (several) are deleted; a running trial's are never touched, and the
study's record of each trial (parameters, values, job folder, metrics) stays whole."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import optuna
from optuna.trial import TrialState

from rlexp.trainer.checkpoint import dir_size

log = logging.getLogger(__name__)

KEEP_WEIGHTS = ("best", "all", "none")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def best_numbers(study: optuna.Study) -> set[int]:
    """The best trial's number (single objective) or the Pareto front's (several); empty before one completes."""
    try:
        if len(study.directions) > 1:
            return {t.number for t in study.best_trials}
        return {study.best_trial.number}
    except ValueError:  # no completed trial yet
        return set()


def prune_weights(study: optuna.Study, keep: str = "best") -> list[tuple[Path, int]]:
    """Delete the ``checkpoints/`` of the finished trials that ``keep`` does not keep; the (path, bytes) freed."""
    if keep not in KEEP_WEIGHTS:
        raise ValueError(f"hydra.sweeper.keep_weights={keep!r} is not one of {list(KEEP_WEIGHTS)}")
    if keep == "all":
        return []
    keepers = best_numbers(study) if keep == "best" else set()
    freed = []
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        job_dir = t.user_attrs.get("job_dir")
        if t.number in keepers or not job_dir:
            continue
        path = Path(job_dir) / "checkpoints"
        if path.exists():
            size = dir_size(path)
            shutil.rmtree(path, ignore_errors=True)
            freed.append((path, size))
            log.info("trial %d: deleted its checkpoints (%d MB; keep_weights=%s)", t.number, size // 10**6, keep)
    return freed


def kept_weights(study: optuna.Study) -> list[tuple[int, Path, int]]:
    """(trial number, checkpoints folder, bytes) of every trial that still has checkpoints."""
    out = []
    for t in study.get_trials(deepcopy=False):
        job_dir = t.user_attrs.get("job_dir")
        if job_dir and (Path(job_dir) / "checkpoints").exists():
            out.append((t.number, Path(job_dir) / "checkpoints", dir_size(Path(job_dir) / "checkpoints")))
    return out
