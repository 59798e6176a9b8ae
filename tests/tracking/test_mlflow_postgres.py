"""The outage scenario on a tracking server with a PostgreSQL backend store (where PostgreSQL is
installed): the server is killed mid-run and restarted; every (metric, step) arrives once."""

import json
import logging

import pytest
from mlflow import MlflowClient

from rlexp.runs.training import run
from rlexp.tracking.base import read_jsonl
from rlexp.tracking.replay import replay
from tests.tracking.test_mlflow_outage import At, expected_steps, steps_per_metric, tracker_overrides

pytestmark = pytest.mark.slow


def test_postgres_backed_server_killed_and_restarted_mid_run(
    tiny_cfg, tmp_path, postgres_uri, make_mlflow_server, caplog
):
    caplog.set_level(logging.WARNING, logger="rlexp.tracking.mlflow_tracker")
    server = make_mlflow_server(postgres_uri)
    cfg = tiny_cfg(
        "trainer.max_steps=5",
        *tracker_overrides(server.url, retry_interval=0.5, max_retry_interval=2, flush_timeout=60),
    )
    assert run(cfg, callbacks=[At({2: server.kill, 3: server.start})]).last_step == 5
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "unreachable" in messages and "reachable again" in messages, messages
    run_dir = tmp_path / "run"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=server.url)
    assert steps_per_metric(client, run_id, rows) == expected_steps(rows)
    assert client.get_run(run_id).info.status == "FINISHED"
    # the server's store really is PostgreSQL: read the run back through it directly
    assert MlflowClient(tracking_uri=postgres_uri).get_run(run_id).data.tags["algorithm"] == cfg.algorithm.name
    assert replay(run_dir)["uploaded"] == 0
