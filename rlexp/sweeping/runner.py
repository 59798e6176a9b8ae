"""The sweep loop behind ``hydra/sweeper=rlexp_optuna``: ask Optuna for a trial, launch it as a Hydra
job through the configured launcher, tell Optuna how it ended; keep ``n_jobs`` trials in flight.

- Asynchronous: a new trial starts as soon as one ends (no idle worker while a batch finishes),
  for launchers that run jobs out of process (joblib, submitit, rlexp_ray). The basic launcher runs jobs
  in this process, one at a time.
- Study-wide budget: ``n_trials`` counts every trial of the study, so a re-run (resume) or a second
  worker on the same storage only adds what is missing; trial number = Hydra job number, so job
  folders keep counting. A trial left RUNNING by a killed worker is failed as interrupted and run again
  (``rlexp.sweeping.trials``); a worker that has nothing left to launch first makes sure that every trial
  still RUNNING has a live worker.
- Checked before the first trial: the search space's bounds (``search_space``), the objective names
  against the metrics the jobs will return (``metric_names``, rlexp train only), and that a re-run of a
  study keeps its fixed settings (the plain overrides, stored as the study's user attr ``fixed_settings``).
- A job whose config has the ``trial_key`` node (rlexp train: ``trial``) learns which trial it is from
  ``trial.storage/study/number`` overrides and reports its metric to the trial at every step
  (``rlexp.sweeping.callback``); any other Hydra app gets only its parameters. A job its pruner stopped
  is told PRUNED, a job that raised FAIL (with its error), anything else COMPLETE with the objective(s):
  its returned float / list of floats, or the ``objective`` metrics of its returned dict.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import Trial, TrialState

from rlexp.core.progress import Bars
from rlexp.sweeping import trials as tr
from rlexp.sweeping.metric_names import ProducedMetrics, check_metric_name, produced_metrics
from rlexp.sweeping.objectives import as_list, metric_key, objective_values
from rlexp.sweeping.retention import KEEP_WEIGHTS, prune_weights
from rlexp.sweeping.search_space import build_search_space, format_value, grid_points, range_values
from rlexp.sweeping.settings import (
    GRID,
    SweepConfigError,
    build_sampler,
    check_sampler,
    search_space_params,
    trial_node_key,
)
from rlexp.sweeping.storage import open_storage, redact, resolve_storage, storage_lock

log = logging.getLogger(__name__)

# samplers whose seed fixes one sequence indexed by trial number (grid order, Sobol scramble): never re-seeded
FIXED_SEQUENCE = (GRID, "optuna.samplers.QMCSampler")
NOP = "optuna.pruners.NopPruner"
STUDY_ATTRS = ("objectives", "report_metric", "pruner")
FIXED_ATTR = "fixed_settings"
PLACEMENT = ("trainer.device", "trainer.num_threads", "trainer.progress")  # not part of a study's fixed settings
# searched keys that can change which metrics a train job returns (probed for the objective check)
METRIC_KEYS = ("reward", "eval", "benchmark", "trainer.accuracy_term")
MAX_PROBES = 24
SETTLE_POLL_S = 2.0


@dataclass
class Outcome:
    """How one trial ended, as this worker saw it."""

    number: int
    state: str
    values: list | None = None
    error: str | None = None
    job_dir: str | None = None


@dataclass
class SweepState:
    failures: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    last_error: str | None = None


def suggest(trial: Trial, name: str, dist: BaseDistribution) -> Any:
    """Sample one parameter through the public Trial API."""
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise SweepConfigError(f"hydra.sweeper.params.{name}: unsupported distribution {dist}")


def best_so_far(study: optuna.Study) -> str:
    """The progress line's note: the best value so far (its trial), or the Pareto front's size."""
    try:
        if len(study.directions) > 1:
            return f"Pareto front: {len(study.best_trials)} trial(s)"
        return f"best {study.best_value:.4g} (trial {study.best_trial.number})"
    except ValueError:
        return "no trial completed yet"


def error_text(e: BaseException) -> tuple[str, str]:
    """(one-line error, traceback text) of a job's exception."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{type(e).__name__}: {e}"[:2000], tb[-8000:]


def fixed_settings(fixed: dict[str, Any]) -> dict[str, str]:
    """The plain (not searched) overrides every trial gets, as stored on the study: ``+key`` and ``++key`` are
    ``key``; where and how a worker runs its trials (``PLACEMENT``: its device, threads, progress bar) may differ
    between workers of one study, so it is left out."""
    out = {k.lstrip("+"): str(v) for k, v in sorted(fixed.items())}
    return {k: v for k, v in out.items() if k not in PLACEMENT}


def settings_tag(fixed: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(fixed, sort_keys=True).encode()).hexdigest()[:8]


def _shorten(value: Any, n: int = 40) -> str:
    text = str(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def settings_diff(old: dict[str, str], new: dict[str, str], limit: int = 6) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    shown = [f"{k}: {_shorten(old.get(k, '(not set)'))} -> {_shorten(new.get(k, '(not set)'))}" for k in keys[:limit]]
    if len(keys) > limit:
        shown.append(f"... {len(keys) - limit} more")
    return ", ".join(shown)


def _metric_key_searched(key: str) -> bool:
    key = key.lstrip("+~")
    return any(key == k or key.startswith(k + ".") for k in METRIC_KEYS)


def probe_values(dist: BaseDistribution) -> list:
    """Values of a searched parameter to compose the config with: every choice, or both bounds."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    return [dist.low, dist.high]


class OptunaSweep:
    def __init__(
        self,
        settings: DictConfig,
        config: DictConfig,
        launcher,
        sequential: bool,
        compose: Callable[[list[str]], DictConfig] | None = None,
    ):
        """``compose(overrides)``: a job's config for these overrides (Hydra's ``load_sweep_config``), used
        to check the objectives before the first trial; None skips that check."""
        self.s, self.config, self.launcher, self.compose = settings, config, launcher, compose
        if settings.get("keep_weights", "best") not in KEEP_WEIGHTS:
            raise SweepConfigError(
                f"hydra.sweeper.keep_weights={settings.keep_weights!r} is not one of {list(KEEP_WEIGHTS)}"
            )
        self.bars: Bars | None = None
        self.bar = None
        self.directions = [str(d) for d in as_list(settings.direction)] or ["minimize"]
        for d in self.directions:
            if d not in ("minimize", "maximize"):
                raise SweepConfigError(f"hydra.sweeper.direction: {d!r} is neither minimize nor maximize")
        self.objectives = [metric_key(o) for o in as_list(settings.get("objective"))]
        if self.objectives and len(self.objectives) != len(self.directions):
            raise SweepConfigError(
                f"hydra.sweeper.objective has {len(self.objectives)} metric(s) but "
                f"hydra.sweeper.direction has {len(self.directions)}"
            )
        self.report_metric = (
            metric_key(settings.report_metric)
            if settings.get("report_metric")
            else (self.objectives[0] if self.objectives else None)
        )
        self.pruner_cfg = (
            OmegaConf.to_container(settings.pruner, resolve=True) if settings.get("pruner") else {"_target_": NOP}
        )
        pruning = self.pruner_cfg.get("_target_") != NOP
        if len(self.directions) > 1 and pruning:
            raise SweepConfigError(
                "hydra.sweeper.pruner: Optuna cannot prune multi-objective studies; "
                "use hydra/sweeper/pruner=none with several directions"
            )
        if pruning and self.report_metric is None:
            raise SweepConfigError(
                "hydra.sweeper.pruner needs a metric the jobs report at every step: set "
                "hydra.sweeper.objective (or hydra.sweeper.report_metric)"
            )
        if settings.n_trials < 1:
            raise SweepConfigError(f"hydra.sweeper.n_trials={settings.n_trials}: must be >= 1")
        if settings.n_jobs < 1:
            raise SweepConfigError(f"hydra.sweeper.n_jobs={settings.n_jobs}: must be >= 1")
        if not 0.0 <= settings.max_failure_rate <= 1.0:
            raise SweepConfigError(f"hydra.sweeper.max_failure_rate={settings.max_failure_rate}: must be in [0, 1]")
        self.in_flight = 1 if sequential else settings.n_jobs
        if sequential and settings.n_jobs > 1:
            log.info(
                "hydra.sweeper.n_jobs=%d with the basic launcher: it runs one job at a time in this "
                "process; use hydra/launcher=joblib (or slurm, submitit_local, rlexp_ray) for parallel trials",
                settings.n_jobs,
            )
        self.sampler_cfg = settings.sampler
        check_sampler(str(self.sampler_cfg._target_))
        self.seed = settings.sampler.get("seed")
        # other samplers get seed + trial number per trial, so resumed sweeps and parallel workers
        # sharing a seed do not replay the same draws
        self.per_trial_seed = self.seed is not None and settings.sampler._target_ not in FIXED_SEQUENCE
        self.trial_key = trial_node_key(settings.get("trial_key", "trial"), config)
        if pruning and self.trial_key is None:
            log.warning(
                "hydra.sweeper.pruner is set but the app's config has no %r node (storage, study, number): "
                "its jobs cannot report to their trials, so nothing is pruned",
                settings.get("trial_key"),
            )
        self.hook: Callable | None = (
            get_method(settings.custom_search_space) if settings.get("custom_search_space") else None
        )
        self.sweep_dir = str(config.hydra.sweep.dir)
        self.study_name = settings.study_name or str(config.hydra.job.name)
        self.storage_url = resolve_storage(settings.storage, self.sweep_dir, self.study_name)
        self.grace = (
            settings.grace_period if settings.get("grace_period") is not None else 4 * settings.heartbeat_interval
        )
        self.state = SweepState()
        self._last_recovery = 0.0

    # ---- study ----------------------------------------------------------------------------------
    def make_sampler(self, seed: int | None):
        return build_sampler(self.sampler_cfg, seed, getattr(self, "grid", None))

    def open_study(self) -> optuna.Study:
        with storage_lock(self.storage_url):  # workers starting together must not both create the tables
            self.storage = open_storage(self.storage_url)
            study = optuna.create_study(
                storage=self.storage,
                study_name=self.study_name,
                directions=self.directions,
                sampler=self.make_sampler(self.seed),
                pruner=instantiate(self.pruner_cfg),
                load_if_exists=True,
            )
        existing = [d.name.lower() for d in study.directions]
        if existing != self.directions:
            raise SweepConfigError(
                f"hydra.sweeper.direction={self.directions}: study {self.study_name!r} in "
                f"{redact(self.storage_url)} was created with {existing}; use another study_name"
            )
        self.check_fixed_settings(study)
        for key, value in zip(STUDY_ATTRS, (self.objectives, self.report_metric, self.pruner_cfg)):
            study.set_user_attr(key, value)
        return study

    def check_fixed_settings(self, study: optuna.Study) -> None:
        """A study keeps its fixed settings: a re-run (or another worker) with other plain overrides would mix
        trials of two experiments in one study, so it is refused, naming the keys and a new study name. A study
        without trials (or from before the settings were stored) takes this run's."""
        fixed = fixed_settings(self.fixed)
        stored = study.user_attrs.get(FIXED_ATTR)
        if stored is not None and stored != fixed and self.storage.get_n_trials(study._study_id) > 0:
            name = f"{self.study_name}-{settings_tag(fixed)}"
            new_dir = "" if Path(self.sweep_dir).name == self.study_name else " and a new hydra.sweep.dir"
            raise SweepConfigError(
                f"hydra.sweeper.study_name={self.study_name}: the study in {redact(self.storage_url)} was run with "
                f"other fixed settings ({settings_diff(stored, fixed)}); re-run with its settings to resume it, or "
                f"start a new study: hydra.sweeper.study_name={name}{new_dir}"
            )
        if stored != fixed:
            study.set_user_attr(FIXED_ATTR, fixed)

    # ---- objectives vs the metrics the jobs return ------------------------------------------------
    def produced(self) -> ProducedMetrics | None:
        """What decides the metric names of this sweep's train jobs: the job config with the fixed overrides,
        joined over each value (bounds) of a searched key that can change them (reward, eval, benchmark);
        None when the app is not ``rlexp train`` or its config cannot be composed here (the job reports that)."""
        assert self.compose is not None
        base = [f"{k}={v}" for k, v in self.fixed.items()]
        try:
            out = produced_metrics(self.compose(base))
        except Exception as e:
            log.debug("objective check skipped: the job config does not compose here (%s)", e)
            return None
        if out is None:
            return None
        probes = [(k, v) for k, dist in self.space.items() if _metric_key_searched(k) for v in probe_values(dist)]
        for key, value in probes[:MAX_PROBES]:
            try:
                out = out.union(produced_metrics(self.compose([*base, f"{key}={format_value(value)}"])))
            except Exception:  # that trial fails on its own, saying why
                continue
        return out

    def check_objectives(self) -> None:
        """Refuse, before any trial, an objective (or report_metric) that the jobs will surely not return."""
        if self.compose is None or not self.s.get("check_objective", True):
            return
        names = [("hydra.sweeper.objective", o) for o in as_list(self.s.get("objective"))]
        if self.s.get("report_metric"):
            names.append(("hydra.sweeper.report_metric", self.s.report_metric))
        if not names:
            return
        produced = self.produced()
        if produced is None:
            return
        for key, name in names:
            check_metric_name(str(name), produced, key)

    # ---- one trial ------------------------------------------------------------------------------
    def ask(self, study: optuna.Study) -> Trial | None:
        """A new trial, or None once the study holds ``n_trials`` trials (counted across workers)."""
        with storage_lock(self.storage_url):
            existing = self.storage.get_all_trials(study._study_id, deepcopy=False)
            waiting = any(t.state == TrialState.WAITING for t in existing)  # retries: already counted, never dropped
            if tr.counted(existing) >= self.n_trials and not waiting:
                return None
            expected = len(existing)
            if self.per_trial_seed:
                study.sampler = self.make_sampler(self.seed + expected)
            trial = study.ask()
        if self.per_trial_seed and trial.number != expected:
            study.sampler = self.make_sampler(self.seed + trial.number)
        return trial

    def configure(self, trial: Trial) -> list[str]:
        """Sample the trial's parameters; its job's overrides."""
        for name, dist in self.space.items():
            suggest(trial, name, dist)
        for name, value in self.fixed.items():
            trial.set_user_attr(name, value)
        derived = {}
        if self.hook is not None:
            derived = self.hook(self.config, trial) or {}
            trial.set_user_attr("derived", {k: v for k, v in derived.items()})
        overlap = set(trial.params) & (set(self.fixed) | set(derived))
        if overlap:
            raise SweepConfigError(f"hydra.sweeper.params: {sorted(overlap)} are both searched and fixed/derived")
        fixed = {k: v for k, v in self.fixed.items() if k not in derived}  # a derived value replaces a fixed one
        values = {**trial.params, **fixed, **derived}
        overrides = [f"{k}={v if k in fixed else format_value(v)}" for k, v in values.items()]
        if self.trial_key:
            overrides += [
                f"{self.trial_key}.storage='{self.storage_url}'",
                f"{self.trial_key}.study='{self.study_name}'",
                f"{self.trial_key}.number={trial.number}",
            ]
        return overrides

    def launch(self, overrides: list[str], number: int):
        """Run one job; its JobReturn, or the exception the launcher itself raised."""
        try:
            return self.launcher.launch([overrides], initial_job_idx=number)[0]
        except Exception as e:
            return e

    def tell(self, study: optuna.Study, trial: Trial, ret) -> Outcome:
        storage, tid = self.storage, trial._trial_id
        job_dir = None
        error: BaseException | None = ret if isinstance(ret, BaseException) else None
        returned = None
        if error is None:
            try:
                job_dir = str(ret.hydra_cfg.hydra.runtime.output_dir)
            except Exception:
                job_dir = None
            try:
                returned = ret.return_value
            except Exception as e:
                error = e
        frozen = storage.get_trial(tid)
        if frozen.state.is_finished():  # recovered as stale by another worker meanwhile
            log.warning("trial %d was already %s when its job ended", trial.number, frozen.state.name)
            return Outcome(trial.number, frozen.state.name, job_dir=job_dir)
        if job_dir:
            trial.set_user_attr("job_dir", job_dir)
        values = None
        if error is None and frozen.user_attrs.get(tr.PRUNED_AT) is None:
            try:
                values = objective_values(returned, self.objectives, len(self.directions))
            except ValueError as e:
                error = e
        if error is not None:
            line, tb = error_text(error)
            trial.set_user_attr("error", line)
            trial.set_user_attr("traceback", tb)
            self._tell(study, trial, TrialState.FAIL)
            self.state.failures += 1
            self.state.last_error = line
            log.warning("trial %d FAILED: %s", trial.number, line)
            return Outcome(trial.number, "FAIL", error=line, job_dir=job_dir)
        if values is None:
            self._tell(study, trial, TrialState.PRUNED)
            value = storage.get_trial(tid).values
            log.info("trial %d PRUNED at step %s (last value %s)", trial.number, frozen.user_attrs[tr.PRUNED_AT], value)
            return Outcome(trial.number, "PRUNED", values=value, job_dir=job_dir)
        self._tell(study, trial, TrialState.COMPLETE, values)
        log.info("trial %d COMPLETE: %s", trial.number, dict(zip(self.objectives or ["value"], values)))
        return Outcome(trial.number, "COMPLETE", values=values, job_dir=job_dir)

    @staticmethod
    def _tell(study, trial, state, values=None) -> None:
        try:
            study.tell(trial, values=values, state=state)
        except RuntimeError as e:  # the grid sampler calls study.stop() once the grid is done
            if "Study.stop" not in str(e):
                raise

    # ---- the loop -------------------------------------------------------------------------------
    def failure_budget_left(self) -> bool:
        return self.state.failures <= self.s.max_failure_rate * self.n_trials

    def recover(self, study) -> list[int]:
        """Retry the trials of workers that died (at start, then at most once per heartbeat interval)."""
        self._last_recovery = time.time()
        recovered = tr.recover_stale(study, self.grace)
        if recovered:
            log.info("re-enqueued interrupted trials %s", recovered)
        return recovered

    def settle(self, study) -> bool:
        """Nothing left to launch: before this worker stops, every trial still RUNNING must have a live worker.
        On this machine the owner process tells at once; a trial of another machine must show a new heartbeat
        (waits up to ``heartbeat_interval``) or is retried once silent for ``grace_period``. True when trials
        were enqueued again (the loop goes on)."""
        first_beat: dict[int, float] = {}
        announced = False
        while True:
            if self.recover(study):
                return True
            running = self.storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,))
            pending = []
            for t in running:
                if tr.owner_alive(t.system_attrs.get(tr.OWNER)) is not None:
                    continue  # a live worker on this machine (a dead one was just recovered)
                beat = tr.last_beat(t)
                if beat > first_beat.setdefault(t._trial_id, beat):
                    continue  # it beat since: its worker lives
                pending.append(t.number)
            if not pending:
                return False
            if not announced:
                log.info(
                    "waiting for a heartbeat of trial(s) %s of other machines (they are retried here once silent "
                    "for hydra.sweeper.grace_period=%gs)",
                    pending,
                    self.grace,
                )
                announced = True
            time.sleep(min(SETTLE_POLL_S, max(self.s.heartbeat_interval, 0.05)))

    def start(self, study, heartbeat) -> tuple[Trial, list[str]] | None:
        if not self.failure_budget_left():
            return None
        if time.time() - self._last_recovery > self.s.heartbeat_interval:
            self.recover(study)
        trial = self.ask(study)
        if trial is None:
            return None
        heartbeat.add(trial._trial_id)
        try:
            return trial, self.configure(trial)
        except BaseException:
            heartbeat.discard(trial._trial_id)
            tr.mark_interrupted(study, trial._trial_id, "search-space configuration failed", retry=False)
            raise

    def finish(self, study, heartbeat, trial, ret) -> None:
        heartbeat.discard(trial._trial_id)
        self.state.outcomes.append(self.tell(study, trial, ret))
        try:  # disk: only the best trial's weights stay (hydra.sweeper.keep_weights)
            prune_weights(study, self.s.get("keep_weights", "best"))
        except Exception as e:  # retention is housekeeping: never fail a sweep over it
            log.warning("could not prune trial checkpoints: %r", e)
        if self.bars is not None:
            self.bars.update(self.bar, tr.counted(study.get_trials(deepcopy=False)), info=best_so_far(study))

    def run(self, arguments: list[str]) -> dict:
        params = search_space_params(self.s)
        self.space, self.fixed = build_search_space(params, arguments)
        if not self.space and self.hook is None:  # as upstream: n_trials jobs of the fixed config
            log.info("empty search space: each trial runs the config as given")
        self.check_objectives()
        self.n_trials = self.s.n_trials
        if self.sampler_cfg._target_ == GRID:
            self.grid = grid_points(self.space, range_values(params, arguments))
            size = math.prod(len(v) for v in self.grid.values())
            if size < self.n_trials:
                log.info("grid sampler: %d grid points, n_trials %d -> %d", size, self.n_trials, size)
                self.n_trials = size
        study = self.open_study()
        log.info(
            "Study %r in %s: %s %s, sampler %s, pruner %s, %d trials, %d in flight",
            self.study_name,
            redact(self.storage_url),
            self.directions,
            self.objectives or "(returned value)",
            self.sampler_cfg._target_.rsplit(".", 1)[-1],
            self.pruner_cfg["_target_"].rsplit(".", 1)[-1],
            self.n_trials,
            self.in_flight,
        )
        self.recover(study)
        done_before = tr.counted(self.storage.get_all_trials(study._study_id, deepcopy=False))
        if done_before:
            log.info("resuming: the study already holds %d trial(s)", done_before)
        # log lines, never a live display: a trial's own training bar may be live in this process
        self.bars = Bars(logger=log, live=False)
        self.bar = self.bars.add(f"sweep {self.study_name}", self.n_trials, completed=done_before, unit=" trials")
        with tr.Heartbeat(self.storage, self.s.heartbeat_interval) as heartbeat:
            try:
                self._loop(study, heartbeat)
            except BaseException as e:  # Ctrl-C or a crash of the sweeper itself: give the trials back
                for tid in heartbeat.in_flight():
                    tr.mark_interrupted(study, tid, f"sweep process stopped ({type(e).__name__})")
                raise
        from rlexp.sweeping.summary import write_summary

        results = write_summary(study, self.sweep_dir, self.objectives, self.storage_url, make_plots=self.s.plots)
        if not self.failure_budget_left():
            raise RuntimeError(
                f"{self.state.failures} trial(s) failed in this sweep, more than hydra.sweeper.max_failure_rate="
                f"{self.s.max_failure_rate} of n_trials={self.n_trials}; last error: {self.state.last_error}"
            )
        return results

    def _loop(self, study, heartbeat) -> None:
        if self.in_flight == 1:
            while True:
                while (started := self.start(study, heartbeat)) is not None:
                    trial, overrides = started
                    self.finish(study, heartbeat, trial, self.launch(overrides, trial.number))
                if not self.failure_budget_left() or not self.settle(study):
                    return
        futures: dict = {}
        exhausted = False
        with ThreadPoolExecutor(max_workers=self.in_flight, thread_name_prefix="rlexp-trial") as pool:
            while True:
                while not exhausted and len(futures) < self.in_flight:
                    started = self.start(study, heartbeat)
                    if started is None:
                        exhausted = True
                        break
                    trial, overrides = started
                    futures[pool.submit(self.launch, overrides, trial.number)] = trial
                if not futures:
                    if not self.failure_budget_left() or not self.settle(study):
                        return
                    exhausted = False
                    continue
                done, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                for fut in done:
                    self.finish(study, heartbeat, futures.pop(fut), fut.result())
