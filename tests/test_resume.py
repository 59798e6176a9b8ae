"""`rlexp train` killed with SIGKILL in the middle of a run resumes from its last checkpoint into the
same MLflow run when re-run with the same hydra.run.dir: every step is logged exactly once, in
metrics.jsonl and in MLflow."""

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

MAX_STEPS = 10


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
        "trainer.checkpoint_every=3",
        "trainer.progress=false",
        "dataset.train_size=64",
        "dataset.eval_size=8",
        "eval.size=0",
        "tracker=mlflow",
        f"hydra.run.dir={run_dir}",
    ]


@pytest.mark.long
def test_sigkill_mid_run_resumes_into_the_same_run_logging_each_step_once(tmp_path):
    run_dir = tmp_path / "run"
    db = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": db}
    log1 = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(train_cmd(run_dir), cwd=tmp_path, env=env, stdout=log1, stderr=subprocess.STDOUT)
    jsonl = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    try:
        # kill once step 5 is logged: the checkpoint of step 3 exists, steps 4-5 were logged after it
        while time.monotonic() < deadline and proc.poll() is None:
            if max((r["step"] for r in read_jsonl(jsonl)), default=0) >= 5:
                break
            time.sleep(0.05)
        assert proc.poll() is None, (
            f"the run ended before it could be killed:\n{(tmp_path / 'first.log').read_text()[-3000:]}"
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(r["step"] for r in read_jsonl(jsonl))
    assert 5 <= killed_at < MAX_STEPS
    ckpt_step = json.loads((run_dir / "checkpoints" / "last" / "trainer.json").read_text())["step"]
    assert ckpt_step < killed_at, "the resume must recompute steps that were already logged"
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]

    second = subprocess.run(train_cmd(run_dir), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"Resuming from {run_dir / 'checkpoints' / 'last'} at step {ckpt_step}" in second.stdout + second.stderr

    rows = read_jsonl(jsonl)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1)), "each step exactly once in metrics.jsonl"
    client = MlflowClient(tracking_uri=db)
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id], "the resumed run continues the same MLflow run"
    assert runs[0].info.status == "FINISHED"
    keys = {k for r in rows for k, v in r.items() if k not in ("step", "time") and v is not None}
    for key in sorted(keys):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == [r["step"] for r in rows if r.get(key) is not None], key
    # the values of steps logged before the kill are the first run's (not overwritten by the recomputation)
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "time/step_s")}
    assert hist == {r["step"]: r["time/step_s"] for r in rows}
