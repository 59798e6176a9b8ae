"""W&B runs offline by default (no API key); the offline run directory holds the same metrics and
config as the run's metrics.jsonl and config.yaml."""

import json

import pytest
import yaml

from rlexp.runs.training import run
from rlexp.tracking.base import read_jsonl
from rlexp.tracking.wandb_tracker import WandbTracker, read_offline_run


def test_offline_by_default_and_online_with_a_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert WandbTracker().mode == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert WandbTracker().mode == "online"
    assert WandbTracker(mode="offline").mode == "offline"


@pytest.mark.long
def test_offline_run_holds_the_runs_metrics_and_config(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_cfg("tracker=wandb", "trainer.max_steps=3")
    run(cfg)
    run_dir = tmp_path / "run"
    wb = read_offline_run(run_dir)
    assert "/offline-run-" in wb["file"]
    assert json.loads((run_dir / "tracker_ids.json").read_text())["wandb"] == wb["id"]

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    tags = wb["config"].pop("rlexp_tags")
    assert wb["config"] == config
    assert tags["algorithm"] == config["algorithm"]["name"] and tags["seed"] == str(config["trainer"]["seed"])
    assert tags["git_commit"] and "end_time" in tags  # provenance and the end time reach W&B too
    assert "algorithm=" + config["algorithm"]["name"] in wb["tags"]

    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [h["_step"] for h in wb["history"]] == [r["step"] for r in rows] == [1, 2, 3]
    for h, r in zip(wb["history"], rows):
        metrics = {k: v for k, v in r.items() if k not in ("step", "time")}
        got = {k: h[k] for k in metrics if k in h}
        assert set(got) == {k for k, v in metrics.items() if v is not None}
        for k, v in got.items():
            assert v == pytest.approx(metrics[k], rel=1e-6, abs=1e-9), k
