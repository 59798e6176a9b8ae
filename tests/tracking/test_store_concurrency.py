"""Issue 16: runs started at once on a fresh SQLite MLflow store. The store is created and migrated once, under a
file lock, so every run gets its MLflow run and no run fails on a half-migrated schema."""

import json
import subprocess
import sys

import pytest
from mlflow import MlflowClient

STARTS = 4
START = """
import sys
from rlexp.tracking.mlflow_tracker import MLflowTracker
t = MLflowTracker(sys.argv[1], experiment="race", start_timeout=30)
rid = t.start("run" + sys.argv[2], {}, {"p": "1"}, {"run_dir": "x"})
t.log_metrics({"m": 1.0}, 1)
t.finish()
print(rid)
"""


@pytest.mark.long  # parallel subprocess runs (~9 s)
def test_concurrent_starts_on_a_fresh_sqlite_store_all_get_their_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    procs = [
        subprocess.Popen([sys.executable, "-c", START, uri, str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(STARTS)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
    ids = [out.decode().strip().splitlines()[-1] for out, _ in outs]
    assert all(ids) and len(set(ids)) == STARTS, ids
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(ids)
    assert all(json.dumps(r.data.metrics) == '{"m": 1.0}' for r in runs)


@pytest.mark.long
def test_joblib_multirun_on_a_fresh_store(tmp_path):
    """The README's parallel recipe (`-m hydra/launcher=joblib`) on a fresh `mlruns.db`: three runs, three MLflow
    runs, each with its two steps."""
    from pathlib import Path

    tiny = [
        "model=tiny",
        "trainer.max_steps=2",
        "trainer.prompts_per_step=2",
        "trainer.num_generations=2",
        "trainer.max_new_tokens=8",
        "trainer.num_threads=1",
        "trainer.progress=false",
        "eval.size=0",
        "trainer.checkpoint_every=0",
    ]
    rlexp = Path(sys.executable).parent / "rlexp"
    cmd = [str(rlexp), "train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=3", "trainer.seed=1,2,3", *tiny]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.tags["seed"] for r in runs) == ["1", "2", "3"]
    assert all(len(client.get_metric_history(r.info.run_id, "reward/mean")) == 2 for r in runs)
