"""Issue 16: the provenance artifact in MLflow is the final provenance.json, not the RUNNING snapshot of the start:
the MLflow tracker sends it again when it finishes if MLflow does not hold it as it is now (once: not when the
caller queued it already), and ``rlexp replay`` uploads it too (a run whose last uploads never reached the
server)."""

import json

import yaml
from mlflow import MlflowClient

from rlexp.tracking.mlflow_tracker import MLflowTracker
from rlexp.tracking.replay import replay


def _write_prov(run_dir, status):
    (run_dir / "provenance.json").write_text(json.dumps({"status": status, "end_time": "2026-01-01T00:00:00"}))


def _artifact_status(uri, run_id, dest):
    local = MlflowClient(uri).download_artifacts(run_id, "provenance.json", str(dest))
    return json.loads(open(local).read())["status"]


def _tracker(tmp_path, run_dir):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    t = MLflowTracker(uri, experiment="e", artifact_location=str(tmp_path / "art"))
    run_id = t.start("r", {}, {}, {"run_dir": str(run_dir)})
    return uri, t, run_id


def _count_uploads(t):
    calls = []
    real = t.client.log_artifact

    def counted(run_id, path, artifact_path=None):
        calls.append(path)
        return real(run_id, path, artifact_path)

    t.client.log_artifact = counted
    return calls


def test_finish_uploads_the_final_provenance_when_the_caller_did_not(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_prov(run_dir, "RUNNING")
    uri, t, run_id = _tracker(tmp_path, run_dir)
    t.log_artifact(str(run_dir / "provenance.json"))  # the start's snapshot
    assert t.flush(30)
    _write_prov(run_dir, "FAILED")  # the run ends; nobody uploads it again
    t.finish("FAILED")
    assert _artifact_status(uri, run_id, tmp_path / "dl") == "FAILED"


def test_finish_does_not_upload_it_twice(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_prov(run_dir, "RUNNING")
    uri, t, run_id = _tracker(tmp_path, run_dir)
    uploads = _count_uploads(t)
    t.log_artifact(str(run_dir / "provenance.json"))
    assert t.flush(30)
    _write_prov(run_dir, "FINISHED")
    t.log_artifact(str(run_dir / "provenance.json"))  # the trainer's own upload of the final one
    t.finish()
    assert len(uploads) == 2
    assert _artifact_status(uri, run_id, tmp_path / "dl") == "FINISHED"
    # a run whose final provenance was sent already sends nothing more
    t2_dir = tmp_path / "run2"
    t2_dir.mkdir()
    _write_prov(t2_dir, "FINISHED")
    _, t2, _ = _tracker(tmp_path, t2_dir)
    uploads2 = _count_uploads(t2)
    t2.log_artifact(str(t2_dir / "provenance.json"))
    assert t2.flush(30)
    t2.finish()
    assert len(uploads2) == 1


def test_replay_uploads_the_final_provenance_to_an_existing_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    _write_prov(run_dir, "RUNNING")
    t = MLflowTracker(uri, experiment="e", artifact_location=str(tmp_path / "art"))
    run_id = t.start("r", {}, {}, {})  # no run_dir tag: the tracker cannot send it again itself
    t.log_artifact(str(run_dir / "provenance.json"))
    t.log_metrics({"m": 1.0}, 1)
    assert t.flush(30)
    t._abandon = True  # the server went away before the end: nothing more reached it
    _write_prov(run_dir, "FINISHED")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 1.0e9, "m": 1.0}) + "\n")
    (run_dir / "tracker_ids.json").write_text(json.dumps({"mlflow": run_id}))
    cfg = {"tracker": {"backends": {"mlflow": {"tracking_uri": uri, "experiment": "e"}}}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert _artifact_status(uri, run_id, tmp_path / "before") == "RUNNING"
    out = replay(run_dir)
    assert out["run_id"] == run_id and out["uploaded"] == 0
    assert _artifact_status(uri, run_id, tmp_path / "after") == "FINISHED"
    assert MlflowClient(uri).get_run(run_id).info.status == "FINISHED"
