"""Trial bookkeeping shared by all sweep workers of a study, through the storage only:

- a heartbeat (trial system attr) that the worker running a trial refreshes while the trial is in
  flight, so that a trial left RUNNING by a killed worker can be recognised (any storage, journal
  included — Optuna's own heartbeat exists for RDB storages only);
- recovery: such a stale trial is marked FAIL ("interrupted") and its parameters are enqueued again,
  so a resumed sweep re-runs it under a new number;
- the study-wide trial budget: every trial counts except the interrupted ones.

Attribute names (visible in optuna-dashboard): user attrs ``job_dir``, ``error``, ``traceback``,
``pruned_at_step``, ``retry_of``; system attrs ``rlexp:heartbeat``, ``rlexp:interrupted``.
"""

from __future__ import annotations

import logging
import threading
import time

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from rlexp.sweeping import PRUNED_AT  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

HEARTBEAT = "rlexp:heartbeat"
INTERRUPTED = "rlexp:interrupted"


def is_interrupted(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.FAIL and bool(trial.system_attrs.get(INTERRUPTED))


def counted(trials: list[FrozenTrial]) -> int:
    """Trials that use up the study's ``n_trials`` budget (all but interrupted ones)."""
    return sum(1 for t in trials if not is_interrupted(t))


def last_beat(trial: FrozenTrial) -> float:
    beat = trial.system_attrs.get(HEARTBEAT)
    if beat is not None:
        return float(beat)
    start = trial.datetime_start
    return start.timestamp() if start is not None else 0.0


def mark_interrupted(study, trial_id: int, reason: str, retry: bool = True) -> bool:
    """Fail a RUNNING trial as interrupted and (``retry``) enqueue its parameters again. Returns
    False when another worker finished or recovered it first."""
    storage = study._storage
    try:  # attributes first: a finished trial accepts no more writes
        storage.set_trial_system_attr(trial_id, INTERRUPTED, True)
        storage.set_trial_user_attr(trial_id, "error", f"interrupted: {reason}")
        if not storage.set_trial_state_values(trial_id, TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    frozen = storage.get_trial(trial_id)
    if retry:
        study.enqueue_trial(dict(frozen.params), user_attrs={"retry_of": frozen.number})
    log.warning("trial %d interrupted (%s)%s", frozen.number, reason, "; enqueued again" if retry else "")
    return True


def recover_stale(study, grace_period: float, now: float | None = None) -> list[int]:
    """Numbers of the RUNNING trials without a heartbeat for ``grace_period`` seconds, now failed
    as interrupted and enqueued again."""
    now = time.time() if now is None else now
    recovered = []
    for t in study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        silent = now - last_beat(t)
        if silent > grace_period and mark_interrupted(study, t._trial_id, f"no heartbeat for {silent:.0f} s"):
            recovered.append(t.number)
    return recovered


class Heartbeat:
    """A daemon thread that stamps ``rlexp:heartbeat`` on the trials this worker has in flight."""

    def __init__(self, storage, interval: float):
        self.storage, self.interval = storage, interval
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlexp-sweep-heartbeat", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def add(self, trial_id: int) -> None:
        with self._lock:
            self._ids.add(trial_id)
        self.beat(trial_id)

    def in_flight(self) -> list[int]:
        with self._lock:
            return list(self._ids)

    def discard(self, trial_id: int) -> None:
        with self._lock:
            self._ids.discard(trial_id)

    def beat(self, trial_id: int) -> None:
        try:
            self.storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
        except UpdateFinishedTrialError:
            self.discard(trial_id)
        except Exception as e:  # a busy database must not kill the sweep; the next beat retries
            log.debug("heartbeat of trial id %d failed: %s", trial_id, e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                ids = list(self._ids)
            for trial_id in ids:
                self.beat(trial_id)
