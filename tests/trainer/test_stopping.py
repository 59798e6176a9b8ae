"""The stop policy of rlexp.trainer.stopping, in process: the first SIGTERM/SIGINT only requests a stop (the
step finishes), a second one or the end of trainer.stop_grace_s stops at once, and the previous handlers come
back afterwards."""

import os
import signal
import time

import pytest

from rlexp.trainer.stopping import GracefulStop, RunStopped


def test_the_first_signal_requests_a_stop_the_second_stops_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with GracefulStop(None) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(RunStopped) as e:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert e.value.exit_code == 128 + signal.SIGTERM and not e.value.checkpointed
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_step_that_outlasts_the_grace_is_cut_short():
    with GracefulStop(0.2) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        start = time.monotonic()
        with pytest.raises(RunStopped, match="stopped by SIGINT; rerun the same command"):
            time.sleep(5)  # a step still running
        assert time.monotonic() - start < 2 and stop.requested


def test_a_step_that_ends_in_time_disarms_the_deadline():
    with GracefulStop(0.2) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        stop.step_ended()  # the loop reached the step boundary: the checkpoint save is not cut short
        time.sleep(0.4)
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
