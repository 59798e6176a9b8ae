"""Stopping a run on SIGTERM (how schedulers stop jobs) or SIGINT (Ctrl-C) without losing it.

The policy: the first signal lets the current step finish, then the run checkpoints, is marked KILLED in
provenance.json and the trackers, and exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT),
so that rerunning the same command resumes it at the next step. A step that has not ended within
``trainer.stop_grace_s`` seconds of the signal, or a second signal, stops the run at once: it is marked
KILLED and resumes from its previous checkpoint. Schedulers send SIGKILL some time after SIGTERM (SLURM's
KillWait and Kubernetes' grace period are 30 s by default), so the grace is kept below that."""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunStopped(KeyboardInterrupt):
    """The run stopped on a signal after checkpointing (or at once); ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int, step: int | None, checkpointed: bool):
        self.signum, self.step, self.checkpointed = signum, step, checkpointed
        name = signal.Signals(signum).name
        if checkpointed:
            msg = f"stopped by {name} after step {step}, checkpoint saved; rerun the same command to resume"
        else:
            msg = f"stopped by {name}; rerun the same command to resume from the last checkpoint"
        super().__init__(msg)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class GracefulStop:
    """Context manager: while active (in the main thread), SIGTERM and SIGINT request a stop at the next step
    boundary instead of killing the process; ``requested`` tells the loop. Outside the main thread (signals
    cannot be caught there) it does nothing."""

    def __init__(self, grace_s: float | None):
        self.grace_s = grace_s
        self.signum: int | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> GracefulStop:
        self._raise_logging_errors = logging.raiseExceptions
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        self.step_ended()
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        logging.raiseExceptions = self._raise_logging_errors

    def step_ended(self) -> None:
        """The step the stop waited for is over: no deadline any more (the checkpoint save is not cut short)."""
        if self._previous and signal.getsignal(signal.SIGALRM) == self._on_deadline:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def _on_signal(self, signum, frame) -> None:
        if self.signum is not None:  # the second signal: stop now
            log.warning("%s again: stopping at once", signal.Signals(signum).name)
            raise RunStopped(self.signum, None, checkpointed=False)
        self.signum = signum
        # Ctrl-C under `| tee` kills tee too: the log lines until the stop must not each print a traceback
        logging.raiseExceptions = False
        if self.grace_s:
            log.warning(
                "%s: finishing the current step (at most %g s), then checkpointing and stopping; send it again to "
                "stop at once",
                signal.Signals(signum).name,
                self.grace_s,
            )
            signal.signal(signal.SIGALRM, self._on_deadline)
            signal.setitimer(signal.ITIMER_REAL, self.grace_s)
        else:
            log.warning(
                "%s: finishing the current step, then checkpointing and stopping; send it again to stop at once",
                signal.Signals(signum).name,
            )

    def _on_deadline(self, signum, frame) -> None:
        log.warning("the step did not end within trainer.stop_grace_s=%g s: stopping at once", self.grace_s)
        raise RunStopped(self.signum, None, checkpointed=False)
