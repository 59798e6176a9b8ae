"""Every provenance field of a run reaches MLflow: read back through the MLflow client."""

import json
import re

import torch
import yaml
from mlflow import MlflowClient
from omegaconf import OmegaConf

from rlexp.runs.training import run
from rlexp.tracking.params import flatten


def test_provenance_fields_reach_mlflow(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("RLEXP_SWEEP", "sweep-abc")
    monkeypatch.setenv("RLEXP_TRIAL", "3")
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    cfg = tiny_cfg("tracker=mlflow", f"tracker.backends.mlflow.tracking_uri={uri}", "trainer.seed=7")
    run(cfg)
    run_dir = tmp_path / "run"
    prov = json.loads((run_dir / "provenance.json").read_text())
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=uri)
    r = client.get_run(run_id)

    # resolved config: as flattened params and as an artifact
    expected = flatten(OmegaConf.to_container(cfg, resolve=True))
    assert set(r.data.params) == {k[:250] for k in expected}
    assert r.data.params["trainer.seed"] == "7"
    assert r.data.params["algorithm.name"] == cfg.algorithm.name
    assert r.data.params["trainer.max_steps"] == "2"
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "overrides.yaml", "provenance.json"} <= arts
    cfg_back = yaml.safe_load(open(client.download_artifacts(run_id, "config.yaml", str(tmp_path / "dl"))))
    assert cfg_back == OmegaConf.to_container(cfg, resolve=True)

    tags = r.data.tags
    # identity tags
    assert tags["algorithm"] == cfg.algorithm.name
    assert tags["dataset"] == cfg.dataset.name
    assert tags["model"] == cfg.model.name == "tiny-smollm2"
    assert tags["benchmark"] == "none"  # eval.size=0 and no benchmark group
    assert tags["seed"] == "7" and prov["seed"] == 7
    assert tags["sweep"] == "sweep-abc" and tags["trial"] == "3"
    # command-line overrides
    overrides = yaml.safe_load(open(client.download_artifacts(run_id, "overrides.yaml", str(tmp_path / "dl"))))
    assert "trainer.seed=7" in overrides and "model=tiny" in overrides
    assert "trainer.seed=7" in tags["overrides"]
    # git
    assert re.fullmatch(r"[0-9a-f]{40}", tags["git_commit"]), tags["git_commit"]
    assert tags["git_commit"] == prov["git"]["git_commit"] == tags["mlflow.source.git.commit"]
    assert tags["git_dirty"] in ("true", "false")
    # package versions and hardware
    assert tags["pkg.torch"] == torch.__version__
    assert tags["pkg.mlflow"] not in ("", "not installed")
    assert tags["hw.cpu"] and int(tags["hw.cpu_count"]) >= 1
    assert tags["hw.gpu_count"] == str(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert tags["hw.gpu"] == ("none" if not torch.cuda.is_available() else tags["hw.gpu"])
    # start and end times
    assert tags["start_time"] == prov["start_time"]
    assert tags["end_time"] == prov["end_time"] and prov["status"] == "FINISHED"
    assert r.info.status == "FINISHED" and r.info.end_time >= r.info.start_time > 0
    # metrics arrived, each step once
    assert sorted(m.step for m in client.get_metric_history(run_id, "reward/mean")) == [1, 2]


def test_resumed_run_keeps_first_start_time(tiny_cfg, tmp_path):
    from rlexp.tracking.provenance import write_provenance

    cfg = tiny_cfg()
    first = write_provenance(cfg, tmp_path / "p")
    second = write_provenance(cfg, tmp_path / "p")
    assert second["start_time"] == first["start_time"]
    assert len(second["resumed_at"]) == 1
