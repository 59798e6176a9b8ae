"""A real `mlflow server` on loopback goes away in the middle of a run: training keeps going, the
metrics are buffered and flushed when the server returns, or — when it is still away at the end —
left in metrics.jsonl and uploaded by `rlexp replay`; every (metric, step) ends up logged once."""

import json
import logging
import socket
import time

import pytest
from mlflow import MlflowClient

from rlexp.commands.replay import main as replay_main
from rlexp.runs.training import run
from rlexp.tracking.base import read_jsonl
from rlexp.tracking.replay import replay


def steps_per_metric(client, run_id, rows):
    """{metric: sorted steps in MLflow} for every metric of the JSONL rows."""
    keys = {k for r in rows for k, v in r.items() if k not in ("step", "time") and v is not None}
    return {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in keys}


def expected_steps(rows):
    out = {}
    for r in rows:
        for k, v in r.items():
            if k not in ("step", "time") and v is not None:
                out.setdefault(k, []).append(r["step"])
    return {k: sorted(v) for k, v in out.items()}


class At:
    """Training callback: run ``actions[step]()`` at the end of that step; records step end times."""

    def __init__(self, actions):
        self.actions, self.times = actions, {}

    def on_step_end(self, step, metrics, eval_metrics):
        self.times[step] = time.monotonic()
        if step in self.actions:
            self.actions[step]()
        return False


def tracker_overrides(url, **settings):
    return [
        "tracker=mlflow",
        f"tracker.backends.mlflow.tracking_uri='{url}'",
        *[f"+tracker.backends.mlflow.{k}={v}" for k, v in settings.items()],
    ]


@pytest.mark.long
def test_server_killed_and_restarted_mid_run_gets_every_step(tiny_cfg, tmp_path, mlflow_server, caplog):
    caplog.set_level(logging.WARNING, logger="rlexp.tracking.mlflow_tracker")
    cfg = tiny_cfg(
        "trainer.max_steps=8",
        *tracker_overrides(mlflow_server.url, retry_interval=0.5, max_retry_interval=2, flush_timeout=60),
    )
    cb = At({2: mlflow_server.kill, 5: mlflow_server.start})
    result = run(cfg, callbacks=[cb])
    assert result.last_step == 8
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "unreachable" in messages and "reachable again" in messages, messages

    run_dir = tmp_path / "run"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=mlflow_server.url)
    assert steps_per_metric(client, run_id, rows) == expected_steps(rows)
    assert client.get_run(run_id).info.status == "FINISHED"
    # the values are the JSONL's
    hist = {m.step: m.value for m in client.get_metric_history(run_id, "entropy/mean")}
    assert hist == {r["step"]: r["entropy/mean"] for r in rows}
    # nothing left for replay
    assert replay(run_dir)["uploaded"] == 0


@pytest.mark.long
def test_server_hung_until_the_end_then_replay(tiny_cfg, tmp_path, mlflow_server, caplog, capsys):
    """SIGSTOP: connections hang. Training and finish() stay bounded; `rlexp replay` uploads the rest."""
    caplog.set_level(logging.WARNING, logger="rlexp.tracking.mlflow_tracker")
    cfg = tiny_cfg(
        "trainer.max_steps=5", *tracker_overrides(mlflow_server.url, request_timeout=2, max_retries=0, flush_timeout=2)
    )
    cb = At({2: mlflow_server.pause})
    result = run(cfg, callbacks=[cb])
    finished = time.monotonic()
    assert result.last_step == 5
    # waits are bounded: finish took at most flush_timeout + one request, not MLflow's 120 s x 7 retries
    assert finished - cb.times[5] < 30, finished - cb.times[5]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "rlexp replay" in messages, messages

    run_dir = tmp_path / "run"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    mlflow_server.kill()  # the hung server never answered the later batches; start it afresh on the same DB
    mlflow_server.start()
    client = MlflowClient(tracking_uri=mlflow_server.url)
    before = steps_per_metric(client, run_id, rows)
    assert 5 not in before["reward/mean"], "the last step cannot have reached a hung server"

    replay_main([str(run_dir)])
    out = capsys.readouterr().out
    assert f"to MLflow run {run_id}" in out and "uploaded" in out
    assert steps_per_metric(client, run_id, rows) == expected_steps(rows)
    assert client.get_run(run_id).info.status == "FINISHED"  # replay sets the status provenance.json recorded
    # replaying again uploads nothing
    again = replay(run_dir)
    assert again["uploaded"] == 0 and again["present"] == sum(len(v) for v in expected_steps(rows).values())
    assert steps_per_metric(client, run_id, rows) == expected_steps(rows)


@pytest.mark.long
def test_server_down_at_start_then_replay_creates_the_run(tiny_cfg, tmp_path):
    """Nothing listens at the URI: training goes on without MLflow (bounded start); replay creates the
    run later, with the run's params and tags, and records its id for a resume."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tiny_cfg(*tracker_overrides(f"http://127.0.0.1:{port}", start_timeout=2, request_timeout=1, max_retries=0))
    t0 = time.monotonic()
    assert run(cfg).last_step == 2
    assert time.monotonic() - t0 < 120
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "tracker_ids.json").read_text()) == {"mlflow": None}
    rows = read_jsonl(run_dir / "metrics.jsonl")

    uri = f"sqlite:///{tmp_path / 'later.db'}"
    out = replay(run_dir, tracking_uri=uri)
    assert out["created"] and out["uploaded"] == sum(len(v) for v in expected_steps(rows).values())
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    assert run_id == out["run_id"]
    client = MlflowClient(tracking_uri=uri)
    r = client.get_run(run_id)
    assert r.data.tags["algorithm"] == cfg.algorithm.name and r.data.tags["replayed"] == "true"
    assert r.data.params["trainer.max_steps"] == "2"
    assert r.info.status == "FINISHED"
    assert steps_per_metric(client, run_id, rows) == expected_steps(rows)
    assert replay(run_dir, tracking_uri=uri)["uploaded"] == 0
