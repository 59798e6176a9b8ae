"""`rlexp train -m trainer.seed=1,2 model=tiny trainer.max_steps=2` runs two jobs and logs two runs."""

import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient


@pytest.mark.long
def test_multirun_two_seeds_logs_two_runs(tmp_path):
    db = f"sqlite:///{tmp_path}/mlruns.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": db}
    cmd = [
        sys.executable,
        "-m",
        "rlexp.cli",
        "train",
        "-m",
        "trainer.seed=1,2",
        "model=tiny",
        "trainer.max_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.num_generations=4",
        "trainer.max_new_tokens=8",
        "trainer.progress=false",
        "dataset.train_size=32",
        "dataset.eval_size=4",
        f"hydra.sweep.dir={tmp_path}/multi",
        f"tracker.backends.mlflow.artifact_location={tmp_path}/art",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(db)
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    assert sorted(r.data.tags["seed"] for r in runs) == ["1", "2"]
    for r in runs:
        assert r.info.status == "FINISHED"
        assert len(client.get_metric_history(r.info.run_id, "reward/mean")) == 2
