"""The training-side half of a sweep: a trainer callback that reports the sweep's metric to the Optuna
trial at every step where the metric is present (every step for training metrics such as
``reward/mean``, every evaluation for ``eval/...``) and stops training when the study's pruner says
so. The trial is identified by the ``trial.storage/study/number`` overrides the sweeper adds; the
metric and the pruner come from the study's user attrs (set by the sweeper), so a job needs nothing
else. A pruned run gets the tracker tags ``trial_state=PRUNED`` and ``pruned_at_step``.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from rlexp.sweeping import PRUNED_AT
from rlexp.sweeping.objectives import lookup

log = logging.getLogger(__name__)
_STORAGES: dict = {}


class TrialReporter:
    """``on_step_end(step, metrics, eval_metrics) -> stop?`` for one Optuna trial."""

    def __init__(self, storage_url: str, study_name: str, number: int):
        import optuna
        from hydra.utils import instantiate

        from rlexp.sweeping.storage import open_storage

        self.storage_url, self.study_name, self.number = storage_url, study_name, number
        if storage_url not in _STORAGES:  # one connection pool per storage, however many trials run in this process
            _STORAGES[storage_url] = open_storage(storage_url)
        study = optuna.load_study(
            study_name=study_name, storage=_STORAGES[storage_url], sampler=optuna.samplers.RandomSampler()
        )
        attrs = study.user_attrs
        pruner_cfg = attrs.get("pruner") or {"_target_": "optuna.pruners.NopPruner"}
        study.pruner = self.pruner = instantiate(pruner_cfg)
        self.metric = attrs.get("report_metric")
        self.objectives = attrs.get("objectives") or []
        self.multi_objective = len(study.directions) > 1
        storage = study._storage
        trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
        state = storage.get_trial(trial_id).state
        if state.is_finished():
            raise RuntimeError(
                f"trial.number={number}: trial {number} of study {study_name!r} is already {state.name}; "
                "drop the trial.* overrides to train outside the sweep"
            )
        self.trial = optuna.trial.Trial(study, trial_id)
        self.trainer = None
        self.pruned_at: int | None = None
        self._linked = False

    def bind(self, trainer) -> None:
        """Called by ``rlexp.runs.training.run`` with the Trainer before training starts."""
        self.trainer = trainer
        trainer.tags.update({"optuna.study": self.study_name, "optuna.trial": str(self.number)})

    def _link(self) -> None:
        """Record the job's run dir and tracker run ids on the trial (once, after the trackers started)."""
        self._linked = True
        if self.trainer is None:
            return
        run_dir = Path(self.trainer.run_dir)
        self.trial.set_user_attr("run_dir", str(run_dir.resolve()))
        ids = run_dir / "tracker_ids.json"
        if ids.exists():
            try:
                self.trial.set_user_attr("tracker_ids", json.loads(ids.read_text()))
            except (ValueError, OSError):
                pass

    def on_step_end(self, step: int, metrics: dict, eval_metrics: dict) -> bool:
        if not self._linked:
            self._link()
        if self.metric is None or self.multi_objective:  # Optuna has no intermediate values for >1 objective
            return False
        value = lookup({**metrics, **(eval_metrics or {})}, self.metric)
        if value is None or not math.isfinite(value):
            return False
        self.trial.report(value, step)
        if not self.trial.should_prune():
            return False
        self.pruned_at = step
        self.trial.set_user_attr(PRUNED_AT, step)
        if self.trainer is not None:
            self.trainer.tracker.set_tags({"trial_state": "PRUNED", "pruned_at_step": str(step)})
        log.info("trial %d pruned at step %d (%s = %.4g)", self.number, step, self.metric, value)
        return True


def check_objectives_measurable(cfg, objectives: list[str], pruning: bool = False) -> None:
    """An ``eval/...`` objective needs evaluation in the job (held-out greedy eval or benchmarks);
    pruning on it needs evaluations during training, not only at the end."""
    from rlexp.config.schema import ConfigError

    evals = [o for o in objectives if o.startswith("eval/")]
    if not evals:
        return
    if cfg.eval.size <= 0 and not cfg.get("benchmark"):
        raise ConfigError(
            f"hydra.sweeper.objective={objectives} needs evaluation: set eval.size > 0 "
            f"(now {cfg.eval.size}) or a +benchmark"
        )
    if pruning and not cfg.trainer.eval_every:
        log.warning(
            "trainer.eval_every=0: %s is measured only at the last step, so the pruner never stops this "
            "trial early; set trainer.eval_every",
            evals[0],
        )


def sweep_callbacks(cfg) -> list:
    """The trainer callbacks of a job launched by the Optuna sweeper (none for other runs). Also sets
    ``RLEXP_SWEEP``/``RLEXP_TRIAL`` so provenance and tracker tags name the study and trial."""
    t = cfg.get("trial")
    if t is None or t.get("study") is None:
        return []
    if t.get("storage") is None or t.get("number") is None:
        raise ValueError("trial.study is set but trial.storage or trial.number is not: all three come from the sweeper")
    os.environ["RLEXP_SWEEP"] = str(t.study)
    os.environ["RLEXP_TRIAL"] = str(t.number)
    reporter = TrialReporter(str(t.storage), str(t.study), int(t.number))
    if not reporter.objectives:
        from rlexp.config.schema import ConfigError

        raise ConfigError(
            "hydra.sweeper.objective is null, so the sweeper expects a float (or a list of floats) from the "
            "job, but rlexp train returns a dict of metrics: name the metric(s) to optimise, e.g. "
            "hydra.sweeper.objective=eval/accuracy hydra.sweeper.direction=maximize"
        )
    check_objectives_measurable(
        cfg, [reporter.metric or "", *reporter.objectives], pruning=type(reporter.pruner).__name__ != "NopPruner"
    )
    return [reporter]
