"""Issue 16: every ``rlexp`` command reports an error as one line ``error: ...`` on stderr (exit status 2 for a
configuration error, 1 otherwise), with the traceback under ``--verbose`` (before or after the command) or
``HYDRA_FULL_ERROR=1``. The commands run as a user runs them (a subprocess) and fail before any model loads."""

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from rlexp.commands.errors import run_command

TINY = ["model=tiny", "tracker=none", "trainer.progress=false"]


def rlexp(*args, cwd, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "rlexp", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_error_line(stderr: str) -> str:
    """The only line of stderr, an ``error:`` line, with no traceback anywhere."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def with_traceback(stderr: str) -> str:
    """The last line of stderr (the ``error:`` line) after a traceback."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback (most recent call last)" in stderr, stderr
    assert lines[-1].startswith("error: "), stderr
    return lines[-1]


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_a_bad_override_is_one_line_with_exit_2(tmp_path):
    rc, out, err = rlexp("train", "--cfg", "job", "trainer.max_steps=abc", cwd=tmp_path)
    line = one_error_line(err)
    assert rc == 2 and out == ""
    assert "trainer.max_steps=abc" in line and "could not be converted to Integer" in line
    assert "HYDRA_FULL_ERROR" not in err and "Error executing job" not in err


@pytest.mark.parametrize("where", ["before", "after", "env"])
def test_verbose_or_hydra_full_error_prints_the_traceback(tmp_path, where):
    args = ["train", "--cfg", "job", "trainer.max_steps=abc"]
    env = None
    if where == "before":
        args = ["--verbose", *args]
    elif where == "after":
        args = [*args, "--verbose"]
    else:
        env = {"HYDRA_FULL_ERROR": "1"}
    rc, _, err = rlexp(*args, cwd=tmp_path, env=env)
    assert rc == 2
    assert "trainer.max_steps=abc" in with_traceback(err)


def test_verbose_does_not_reach_hydras_override_parser(tmp_path):
    rc, out, err = rlexp("train", "--verbose", "--cfg", "job", "trainer.max_steps=7", cwd=tmp_path)
    assert rc == 0, err
    assert "max_steps: 7" in out


def test_a_missing_config_option_is_one_line_that_lists_the_options(tmp_path):
    rc, _, err = rlexp("train", "--cfg", "job", "model=nonexistent", cwd=tmp_path)
    line = one_error_line(err)
    assert rc == 2 and "model/nonexistent" in line and "tiny" in line


def test_a_bad_override_syntax_names_the_override(tmp_path):
    rc, _, err = rlexp("eval", "--cfg", "job", "eval.n=[", cwd=tmp_path)
    assert rc == 2 and "eval.n=[" in one_error_line(err)


@pytest.mark.long
def test_a_config_error_in_the_run_is_one_line_and_its_traceback_is_in_the_job_log(tmp_path):
    run_dir = tmp_path / "run"
    rc, _, err = rlexp("train", *TINY, "trainer.max_steps=0", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert rc == 2
    assert one_error_line(err) == "error: trainer.max_steps=0: must be >= 1"
    log = (run_dir / "train.log").read_text()
    assert "Traceback" in log and "ConfigError: trainer.max_steps=0: must be >= 1" in log
    rc, _, err = rlexp("train", *TINY, "trainer.max_steps=0", f"hydra.run.dir={run_dir}2", "--verbose", cwd=tmp_path)
    assert rc == 2 and "ConfigError" in err and with_traceback(err) == "error: trainer.max_steps=0: must be >= 1"


def test_a_failed_job_fails_its_multirun_in_one_line_that_names_the_job(tmp_path):
    rc, out, err = rlexp(
        "train", "-m", *TINY, "trainer.max_steps=0,-1", f"hydra.sweep.dir={tmp_path}/multi", cwd=tmp_path
    )
    assert rc == 2
    line = one_error_line(err)
    assert line.startswith("error: job #0 (") and "trainer.max_steps=0" in line and line.endswith("must be >= 1")
    assert "Launching 2 jobs" in out


def _run_dir(tmp_path, uri):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 1.0e9, "m": 1.0}) + "\n")
    (run_dir / "config.yaml").write_text(f"tracker:\n  backends:\n    mlflow:\n      tracking_uri: {uri}\n")
    return run_dir


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_replay_to_a_dead_saved_uri_is_one_line_that_suggests_tracking_uri(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    uri = f"http://127.0.0.1:{port}"
    run_dir = _run_dir(tmp_path, uri)
    rc, _, err = rlexp("replay", str(run_dir), cwd=tmp_path)
    line = one_error_line(err)
    assert rc == 1
    assert uri in line and "config.yaml" in line and "Connection refused" in line and "--tracking-uri" in line
    rc, _, err = rlexp("--verbose", "replay", str(run_dir), cwd=tmp_path)
    assert rc == 1 and uri in with_traceback(err)


@pytest.mark.long
def test_replay_to_a_saved_sqlite_store_that_is_not_here_creates_nothing(tmp_path):
    run_dir = _run_dir(tmp_path, "sqlite:///elsewhere/mlruns.db")
    rc, _, err = rlexp("replay", str(run_dir), cwd=tmp_path)
    line = one_error_line(err)
    assert rc == 1 and "does not exist here" in line and "--tracking-uri" in line
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.long
def test_an_unreachable_tracking_server_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, _, err = rlexp("compare", "--tracking-uri", f"http://127.0.0.1:{port}", cwd=tmp_path)
    line = one_error_line(err)
    assert rc == 1
    assert line == f"error: cannot reach the MLflow tracking server at http://127.0.0.1:{port}: Connection refused"


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_a_refused_store_is_one_line(tmp_path):
    import sqlite3
    from contextlib import closing

    from rlexp.tracking.mlflow_tracker import open_client

    db = tmp_path / "mlruns.db"
    open_client(f"sqlite:///{db}")
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    run_dir = _run_dir(tmp_path, f"sqlite:///{db}")
    rc, _, err = rlexp("replay", str(run_dir), cwd=tmp_path)
    assert rc == 1 and one_error_line(err).startswith(f"error: {db}: MLflow store at schema revision ffffffffffff")


def test_a_refused_argument_is_one_line(tmp_path):
    rc, _, err = rlexp("compare", "--last", "0", cwd=tmp_path)
    assert rc == 1 and one_error_line(err) == "error: --last=0 must be >= 1"
    rc, _, err = rlexp("replay", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert rc == 1 and "metrics.jsonl not found" in one_error_line(err)


def test_no_space_left_on_device_is_one_line(capsys):
    def full(argv):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/run/metrics.jsonl")

    with pytest.raises(SystemExit) as e:
        run_command(full, [], verbose=False)
    assert e.value.code == 1
    assert one_error_line(capsys.readouterr().err) == "error: no space left on device: /data/run/metrics.jsonl"


def test_an_unexpected_error_is_one_line_with_its_type_and_a_pointer_to_verbose(capsys):
    def bug(argv):
        raise KeyError("oops")

    with pytest.raises(SystemExit) as e:
        run_command(bug, [], verbose=False)
    assert e.value.code == 1
    assert one_error_line(capsys.readouterr().err) == "error: KeyError: 'oops' (traceback: rerun with --verbose)"
    with pytest.raises(SystemExit):
        run_command(bug, [], verbose=True)
    assert "KeyError: 'oops'" in with_traceback(capsys.readouterr().err)


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_a_missing_checkpoint_is_one_line(tmp_path):
    rc, _, err = rlexp(
        "eval", *TINY, "benchmark=offline", "eval.limit=1", f"eval.checkpoint={tmp_path}/nowhere", cwd=tmp_path
    )
    line = one_error_line(err)
    assert rc == 1 and f"eval.checkpoint={tmp_path}/nowhere" in line and "FileNotFoundError" not in line


def test_the_usage_names_the_flag():
    from rlexp.cli import USAGE

    assert "--verbose" in USAGE and "HYDRA_FULL_ERROR=1" in USAGE
