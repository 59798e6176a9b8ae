"""A TRL-backed run (``rlexp train algorithm=dpo``) killed with SIGKILL after its first checkpoint resumes from
transformers' checkpoint into the same MLflow run: every step logged once, in metrics.jsonl and in MLflow, and the
own-rollout pairs read back from the run directory, not sampled again."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlexp.tracking.base import read_jsonl

MAX_STEPS = 8
ROOT = Path(__file__).parents[2]


def train_cmd(run_dir: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "rlexp"),
        "train",
        "algorithm=dpo",
        "model=tiny",
        "reward=accuracy",
        "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.prompts_per_step=2",
        "trainer.num_generations=4",
        "trainer.max_new_tokens=8",
        "trainer.micro_batch_size=4",
        "trainer.checkpoint_every=2",
        "trainer.autocast=off",
        "trainer.progress=false",
        "dataset.num_prompts=6",
        "dataset.train_size=64",
        "dataset.eval_size=8",
        "eval.size=0",
        "tracker=mlflow",
        f"hydra.run.dir={run_dir}",
    ]


@pytest.mark.long
def test_sigkill_after_the_first_checkpoint_resumes_logging_each_step_once(tmp_path):
    from mlflow import MlflowClient

    run_dir = tmp_path / "run"
    db = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": db, "PYTHONPATH": str(ROOT)}
    log1 = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(train_cmd(run_dir), cwd=tmp_path, env=env, stdout=log1, stderr=subprocess.STDOUT)
    jsonl = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    try:
        # kill once step 3 is logged: checkpoint-2 was saved after step 2's row, step 3 was logged after it
        while time.monotonic() < deadline and proc.poll() is None:
            if max((r["step"] for r in read_jsonl(jsonl)), default=0) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before the kill:\n{(tmp_path / 'first.log').read_text()[-3000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = max(r["step"] for r in read_jsonl(jsonl))
    assert 3 <= killed_at < MAX_STEPS
    pairs = (run_dir / "preference_pairs.jsonl").read_text()
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    uid = json.loads((run_dir / "run.json").read_text())["uid"]

    second = subprocess.run(train_cmd(run_dir), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "Resuming from" in out and "checkpoint-" in out
    assert "preference pairs:" in out and "read from" in out  # the cached pairs, not sampled again
    assert (run_dir / "preference_pairs.jsonl").read_text() == pairs
    assert json.loads((run_dir / "run.json").read_text())["uid"] == uid

    rows = read_jsonl(jsonl)
    assert [r["step"] for r in rows] == list(range(1, MAX_STEPS + 1)), "each step exactly once in metrics.jsonl"
    client = MlflowClient(tracking_uri=db)
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id], "the resumed run continues the same MLflow run"
    assert runs[0].info.status == "FINISHED"
    for key in ("loss/total", "grad_norm", "lr", "pref/reward_margin", "time/step_s"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, MAX_STEPS + 1)), key
    # the values of steps logged before the kill are the first run's (not overwritten by the recomputation)
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "time/step_s")}
    assert hist == {r["step"]: r["time/step_s"] for r in rows}
    assert json.loads((run_dir / "provenance.json").read_text())["status"] == "FINISHED"
