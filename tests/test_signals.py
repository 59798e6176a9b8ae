"""SIGTERM (how schedulers stop jobs) and SIGINT (Ctrl-C) stop `rlexp train` at the next step boundary with a
checkpoint of that step, mark the run KILLED in provenance.json and MLflow, print one line and exit 128 + the
signal; rerunning the same command resumes it into the same MLflow run with every step logged once. Ctrl-C
under `| tee` (the pipe's reader dies with it) is KILLED too, not FAILED."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlexp.tracking.base import read_jsonl
from rlexp.trainer.checkpoint import checkpoint_step

MAX_STEPS = 8


def train_cmd(run_dir: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "rlexp"),
        "train",
        "model=tiny",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.prompts_per_step=2",
        "trainer.num_generations=4",
        "trainer.max_new_tokens=8",
        "trainer.micro_batch_size=4",
        "trainer.checkpoint_every=100",  # only the stop and the last step checkpoint
        "trainer.progress=false",
        "dataset.train_size=64",
        "dataset.eval_size=8",
        "eval.size=0",
        "tracker=mlflow",
        f"hydra.run.dir={run_dir}",
    ]


def _wait_for_step(proc, jsonl: Path, step: int, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if max((r["step"] for r in read_jsonl(jsonl)), default=0) >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended or stalled before step {step}:\n{log.read_text()[-3000:]}")


def _mlflow_run(db):
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    return client, run


def _stop_and_resume(tmp_path, signum, stdout_pipe_dies=False):
    run_dir = tmp_path / "run"
    db = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": db}
    log = tmp_path / "first.log"
    with open(log, "w") as err:
        out = subprocess.PIPE if stdout_pipe_dies else err
        proc = subprocess.Popen(train_cmd(run_dir), cwd=tmp_path, env=env, stdout=out, stderr=err)
        try:
            _wait_for_step(proc, run_dir / "metrics.jsonl", 2, log)
            if stdout_pipe_dies:
                proc.stdout.close()  # `| tee` killed by the same Ctrl-C: later writes to stdout fail (EPIPE)
            proc.send_signal(signum)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert rc == 128 + signum, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    stopped = [line for line in text.splitlines() if line.startswith("rlexp: stopped by")]
    assert len(stopped) == 1, text[-3000:]
    logged = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert logged == list(range(1, len(logged) + 1)) and logged[-1] < MAX_STEPS
    # the step the signal let finish is checkpointed (checkpoint_every=100: only the stop wrote it)
    assert checkpoint_step(run_dir / "checkpoints" / "last") == logged[-1]
    assert f"after step {logged[-1]}, checkpoint saved" in stopped[0]
    assert json.loads((run_dir / "provenance.json").read_text())["status"] == "KILLED"
    client, run = _mlflow_run(db)
    assert run.info.status == "KILLED"

    done = subprocess.run(train_cmd(run_dir), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(1, MAX_STEPS + 1))
    client, again = _mlflow_run(db)  # the same MLflow run, each step once
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == list(range(1, MAX_STEPS + 1))


@pytest.mark.long
def test_sigterm_checkpoints_marks_killed_and_resumes(tmp_path):
    _stop_and_resume(tmp_path, signal.SIGTERM)


@pytest.mark.long
def test_ctrl_c_under_a_dying_pipe_is_killed_not_failed(tmp_path):
    _stop_and_resume(tmp_path, signal.SIGINT, stdout_pipe_dies=True)
