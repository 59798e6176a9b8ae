"""A run's status is never left RUNNING by a failure: a train that fails before training and an eval that fails
mark provenance.json FAILED; the provenance artifact in MLflow is the final one, not the start's snapshot; a
failed eval is not an empty FAILED MLflow run (it says why and holds its config), and one whose inputs do not
load makes no tracker run at all."""

import json

import pytest
from mlflow import MlflowClient

from rlexp.runs.evaluation import run_eval
from rlexp.runs.training import run
from tests.conftest import TINY, compose_train


@pytest.fixture(autouse=True)
def local_mlflow(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _mlflow(tmp_path):
    return [
        "tracker=mlflow",
        f"tracker.backends.mlflow.tracking_uri=sqlite:///{tmp_path}/mlruns.db",
        f"tracker.backends.mlflow.artifact_location={tmp_path}/art",
    ]


def _runs(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlruns.db")
    exp = client.get_experiment_by_name("rlexp")
    return client, (client.search_runs([exp.experiment_id]) if exp else [])


def _status(run_dir):
    return json.loads((run_dir / "provenance.json").read_text())["status"]


def test_a_failure_before_training_marks_provenance_failed(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_train([*TINY, "+reward.terms.accuracy.bad_option=1"], run_dir)
    with pytest.raises(Exception, match="bad_option"):
        run(cfg)
    assert _status(run_dir) == "FAILED"


def test_the_provenance_artifact_in_mlflow_holds_the_final_status(tmp_path):
    run(compose_train([*TINY, *_mlflow(tmp_path)], tmp_path / "run"))
    client, (r,) = _runs(tmp_path)
    local = client.download_artifacts(r.info.run_id, "provenance.json", str(tmp_path))
    prov = json.loads(open(local).read())
    assert prov["status"] == "FINISHED" and prov["end_time"]


def test_an_eval_whose_checkpoint_is_missing_fails_without_a_tracker_run(tmp_path):
    run_dir = tmp_path / "eval"
    cfg = compose_train(
        ["model=tiny", "benchmark=offline", "eval.limit=1", f"eval.checkpoint={tmp_path}/nowhere", *_mlflow(tmp_path)],
        run_dir,
        "eval",
    )
    with pytest.raises(FileNotFoundError, match="eval.checkpoint="):
        run_eval(cfg)
    assert _status(run_dir) == "FAILED"
    assert _runs(tmp_path)[1] == []  # no empty FAILED run


@pytest.mark.long
def test_an_eval_that_crashes_records_why_in_its_failed_run(tmp_path, monkeypatch):
    from rlexp.evaluation.runner import BenchmarkEvaluator

    def crash(self, *a, **k):
        raise RuntimeError("the judge crashed")

    monkeypatch.setattr(BenchmarkEvaluator, "evaluate", crash)
    run_dir = tmp_path / "eval"
    cfg = compose_train(
        ["model=tiny", "benchmark=offline", "eval.limit=1", "eval.n=2", *_mlflow(tmp_path)], run_dir, "eval"
    )
    with pytest.raises(RuntimeError, match="the judge crashed"):
        run_eval(cfg)
    assert _status(run_dir) == "FAILED"
    client, (r,) = _runs(tmp_path)
    assert r.info.status == "FAILED"
    assert r.data.tags["error"] == "RuntimeError: the judge crashed"
    names = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"config.yaml", "provenance.json"} <= names
