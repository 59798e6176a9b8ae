"""JSONL log repair after a torn write; the MLflow tracker's queue against a real SQLite store:
rejected operations are dropped without blocking the rest, backfill logs only what is missing."""

import json

from mlflow import MlflowClient

from rlexp.tracking.base import JSONLTracker, read_jsonl
from rlexp.tracking.mlflow_tracker import MLflowTracker


def test_jsonl_repairs_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "a": 1.0}) + "\n" + '{"step": 2, "a": 0.')  # killed mid-write
    t = JSONLTracker(path)
    t.start("r", {}, {}, {})
    t.log_metrics({"a": 2.0}, 2)
    rows = read_jsonl(path)
    assert [(r["step"], r["a"]) for r in rows] == [(1, 1.0), (2, 2.0)]
    assert t.last_step() == 2


def test_rejected_metric_is_dropped_and_the_rest_still_logged(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    t = MLflowTracker(uri, experiment="e", artifact_location=str(tmp_path / "art"))
    run_id = t.start("r", {}, {"p": 1}, {"algorithm": "x"})
    t.log_metrics({"bad name!": 1.0}, 1)  # MLflow rejects the name: a permanent error, never retried
    t.log_metrics({"good": 2.0}, 2)
    t.finish()
    assert t.pending() == 0 and len(t.dropped) == 1 and "metrics" == t.dropped[0][0]
    client = MlflowClient(uri)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "good")] == [(2, 2.0)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_backfill_logs_only_missing_steps(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    t = MLflowTracker(uri, experiment="e", artifact_location=str(tmp_path / "art"))
    run_id = t.start("r", {}, {}, {})
    for s in (1, 2):
        t.log_metrics({"a": float(s), "b": 10.0 * s}, s)
    t.finish("KILLED")
    rows = [{"step": s, "time": 1.0e9 + s, "a": float(s), "b": 10.0 * s} for s in (1, 2, 3, 4)]
    rows.append(dict(rows[-1]))  # a step twice in the log is still sent once
    resumed = MLflowTracker(uri, experiment="e")
    assert resumed.start("r", {}, {}, {}, resume_id=run_id) == run_id
    resumed.backfill(rows)
    resumed.log_metrics({"a": 5.0, "b": 50.0}, 5)
    resumed.finish()
    client = MlflowClient(uri)
    for key, scale in (("a", 1.0), ("b", 10.0)):
        hist = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert hist == [(s, scale * s) for s in (1, 2, 3, 4, 5)], key


def test_resume_with_the_server_down_keeps_the_run_id_and_does_not_wait(tmp_path):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = MLflowTracker(f"http://127.0.0.1:{port}", request_timeout=1, max_retries=0, flush_timeout=1)
    t0 = time.monotonic()
    assert t.start("r", {}, {}, {}, resume_id="abc123") == "abc123"
    t.log_metrics({"a": 1.0}, 7)
    assert time.monotonic() - t0 < 2, "a resumed run must not wait for the server"
    t.finish()
    assert t.pending() > 0, "unsent operations stay queued (metrics.jsonl keeps them for rlexp replay)"
    assert time.monotonic() - t0 < 15
