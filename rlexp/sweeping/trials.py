"""Trial bookkeeping shared by all sweep workers of a study, through the storage only:

- a heartbeat (trial system attr) that the worker running a trial refreshes while the trial is in
  flight, so that a trial left RUNNING by a killed worker can be recognised (any storage, journal
  included — Optuna's own heartbeat exists for RDB storages only);
- the trial's owner: the sweep process that runs it (machine, pid and the process's start time), so a
  worker on the same machine knows at once whether the owner still lives — a sweep killed mid-trial and
  re-run at once retries the trial without waiting for the heartbeat's ``grace_period``; on another machine
  only the heartbeat tells;
- recovery: such a stale trial is marked FAIL ("interrupted") and its parameters are enqueued again,
  so a resumed sweep re-runs it under a new number;
- the study-wide trial budget: every trial counts except the interrupted ones.

Attribute names (visible in optuna-dashboard): user attrs ``job_dir``, ``error``, ``traceback``,
``pruned_at_step``, ``retry_of``; system attrs ``rlexp:heartbeat``, ``rlexp:owner``, ``rlexp:interrupted``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from functools import lru_cache
from pathlib import Path

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from rlexp.sweeping import PRUNED_AT  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

HEARTBEAT = "rlexp:heartbeat"
OWNER = "rlexp:owner"
INTERRUPTED = "rlexp:interrupted"


@lru_cache(maxsize=1)
def machine() -> str:
    """This machine and PID namespace: host name, boot id and PID namespace (the last two on Linux), so that
    two containers sharing a host name are not taken for one machine."""
    parts = [socket.gethostname()]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    except OSError:
        pass
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass
    return "|".join(parts)


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of a process from /proc, None when there is no such process.
    Raises OSError where /proc does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():
            raise
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], fields[19]


def process_start(pid: int) -> str | None:
    try:
        stat = _proc_stat(pid)
    except OSError:
        return None
    return stat[1] if stat else None


def owner_record() -> dict:
    """The owner attr of the trials this process runs."""
    pid = os.getpid()
    return {"machine": machine(), "pid": pid, "start": process_start(pid), "host": socket.gethostname()}


def owner_alive(owner) -> bool | None:
    """Whether a trial's owner process still runs: True or False on this machine, None on another machine
    (or for a trial without an owner): then only its heartbeat tells."""
    if not isinstance(owner, dict) or owner.get("machine") != machine() or not isinstance(owner.get("pid"), int):
        return None
    pid = owner["pid"]
    try:
        stat = _proc_stat(pid)
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if stat is None or stat[0] in ("Z", "X"):  # gone, or a zombie nobody reaped yet
        return False
    start = owner.get("start")
    return start is None or stat[1] == start  # another start time: the pid was reused


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


def stale_reason(trial: FrozenTrial, grace_period: float, now: float) -> str | None:
    """Why a RUNNING trial is known to be abandoned, or None: its owner process on this machine is gone, or
    (owner elsewhere or unknown) it had no heartbeat for ``grace_period`` seconds. A live owner on this
    machine is trusted: it tells the trial how it ended."""
    owner = trial.system_attrs.get(OWNER)
    alive = owner_alive(owner)
    if alive is False:
        return f"its sweep process (pid {owner['pid']}) is gone"
    if alive is None:
        silent = now - last_beat(trial)
        if silent > grace_period:
            return f"no heartbeat for {silent:.0f} s"
    return None


def recover_stale(study, grace_period: float, now: float | None = None) -> list[int]:
    """Numbers of the RUNNING trials that are abandoned (``stale_reason``), now failed as interrupted and
    enqueued again."""
    now = time.time() if now is None else now
    recovered = []
    for t in study._storage.get_all_trials(study._study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        reason = stale_reason(t, grace_period, now)
        if reason is not None and mark_interrupted(study, t._trial_id, reason):
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
        try:
            self.storage.set_trial_system_attr(trial_id, OWNER, owner_record())
        except Exception as e:  # without it only the heartbeat tells other workers that this one lives
            log.debug("owner of trial id %d not recorded: %s", trial_id, e)
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
