"""``rlexp pipeline <experiment>`` (rlexp.runs.pipeline): the stage list read and checked, the links between stages
(the next stage loads the previous one's saved model; the child run names its parent), and resuming (a finished
stage is not run again). The tiny runs use the tiny model and 2 steps per stage."""

import json
from pathlib import Path

import pytest
import torch

from rlexp.commands.pipeline import main
from rlexp.runs.pipeline import (
    Pipeline,
    PipelineError,
    Stage,
    lineage_tags,
    load_pipeline,
    parse_pipeline,
    run_pipeline,
    stage_overrides,
)
from tests.algorithms.varying_reward import VARYING
from tests.conftest import TINY

FAST = [*TINY, "trainer.autocast=off", "trainer.max_new_tokens=8"]


def _parse(stages):
    return parse_pipeline("toy", Path("toy.yaml"), {"stages": stages})


def test_the_shipped_pipelines_and_their_links(tmp_path):
    p = load_pipeline("sft_then_grpo")
    assert [(s.name, s.init_from, s.teacher_from) for s in p.stages] == [("sft", None, None), ("grpo", "sft", None)]
    sft, grpo = p.stages
    assert stage_overrides(p, sft, tmp_path)[:2] == ["+experiment=sft_then_grpo", "stage=sft"]
    assert stage_overrides(p, grpo, tmp_path, ["model=tiny"])[-3:] == [
        "model=tiny",
        "model.source=hub",
        f"++model.path={tmp_path}/sft/model",
    ]
    r = load_pipeline("grpo_then_redistill")
    assert [(s.name, s.init_from, s.teacher_from) for s in r.stages] == [
        ("grpo", None, None),
        ("redistill", None, "grpo"),  # the base model is the student, the RL policy the teacher
    ]
    assert stage_overrides(r, r.stages[1], tmp_path)[-1] == f"algorithm.teacher={tmp_path}/grpo/model"


@pytest.mark.parametrize(
    "stages,message",
    [
        ([], "pipeline.stages: must be a non-empty list"),
        ([{"name": "a b"}], "pipeline.stages.0.name: 'a b': a name of letters"),
        ([{"name": "a"}, {"name": "a"}], "pipeline.stages.1.name: 'a': two stages share the name"),
        ([{"name": "a", "model": "x"}], "pipeline.stages.0.model: not a stage key"),
        ([{"name": "a", "overrides": ["stage"]}], "pipeline.stages.0.overrides: must be a list of train overrides"),
        ([{"name": "a", "overrides": ["model.path=/m"]}], "pipeline.stages.0.overrides: 'model.path=/m': set by"),
        ([{"name": "a", "init_from": "b"}, {"name": "b"}], "pipeline.stages.0.init_from: 'b': not a stage before"),
    ],
)
def test_bad_stage_lists_name_the_key(stages, message):
    with pytest.raises(PipelineError) as e:
        _parse(stages)
    assert str(e.value).startswith("toy.yaml: " + message)


def test_init_from_defaults_to_the_stage_before_and_null_to_the_base_model():
    p = _parse([{"name": "a"}, {"name": "b"}, {"name": "c", "init_from": None, "teacher_from": "a"}])
    assert [(s.init_from, s.teacher_from, s.parent) for s in p.stages] == [
        (None, None, None),
        ("a", None, "a"),
        (None, "a", "a"),
    ]


def test_lineage_tags_link_the_parent_run():
    info = {
        "pipeline": "p",
        "stage": "grpo",
        "parent": {"stage": "sft", "run_dir": "/o/sft", "run_uid": "u1", "tracker_ids": {"mlflow": "abc"}},
    }
    assert lineage_tags(info) == {
        "pipeline": "p",
        "pipeline.stage": "grpo",
        "parent_run": "u1",
        "parent_run_dir": "/o/sft",
        "parent_stage": "sft",
        "mlflow.parentRunId": "abc",  # MLflow shows the stage under its parent
    }
    assert lineage_tags({"pipeline": "p", "stage": "sft", "parent": None}) == {"pipeline": "p", "pipeline.stage": "sft"}


def test_a_stage_directory_of_another_config_is_refused(tmp_path):
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "config.yaml").write_text("trainer:\n  max_steps: 99\n")
    with pytest.raises(PipelineError, match=r"^stage sft: .* holds a run of another config \(.*--replace"):
        run_pipeline(load_pipeline("sft_then_grpo"), tmp_path, FAST)


@pytest.mark.long  # ~11 s alone, 25 s on the shared CPU
def test_sft_then_grpo_tiny_run_links_and_resumes(tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from rlexp.models.loading import load_model

    out = tmp_path / "pipe"
    first = main(["sft_then_grpo", *FAST, "--out", str(out)])
    assert [(r.name, r.status) for r in first["results"]] == [("sft", "trained"), ("grpo", "trained")]
    sft, grpo = out / "sft", out / "grpo"
    for d in (sft, grpo):
        assert json.loads((d / "provenance.json").read_text())["status"] == "FINISHED"
    assert [json.loads(x)["step"] for x in (sft / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert "sft/loss" in json.loads((sft / "metrics.jsonl").read_text().splitlines()[-1])
    # the second stage loaded the first one's saved model
    cfg = OmegaConf.load(grpo / "config.yaml")
    assert cfg.model.source == "hub" and Path(cfg.model.path) == sft / "model"
    assert cfg.algorithm.name == "grpo" and cfg.trainer.max_steps == 2
    loaded = load_model(cfg.model, torch.device("cpu")).model.state_dict()
    saved = AutoModelForCausalLM.from_pretrained(sft / "model").state_dict()
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    # ... and names the first one's run as its parent
    lineage = json.loads((grpo / "pipeline.json").read_text())
    assert lineage["parent"]["run_uid"] == json.loads((sft / "run.json").read_text())["uid"]
    assert lineage["parent"]["as"] == "model" and lineage["stage"] == "grpo"
    # resume: the finished stages are not run again
    before = (grpo / "metrics.jsonl").read_text()
    again = main(["sft_then_grpo", *FAST, "--out", str(out)])
    assert [r.status for r in again["results"]] == ["done", "done"]
    assert (grpo / "metrics.jsonl").read_text() == before


@pytest.mark.long
def test_the_child_run_is_tagged_with_its_parent_in_mlflow(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # the MLflow store and artifacts of the runs' working directory
    db = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", db)
    out = tmp_path / "pipe"
    main(["sft_then_grpo", *FAST, "tracker=mlflow", "--out", str(out)])
    ids = {s: json.loads((out / s / "tracker_ids.json").read_text())["mlflow"] for s in ("sft", "grpo")}
    client = MlflowClient(tracking_uri=db)
    child = client.get_run(ids["grpo"]).data.tags
    assert child["mlflow.parentRunId"] == ids["sft"]
    assert child["parent_run"] == json.loads((out / "sft" / "run.json").read_text())["uid"]
    assert child["pipeline"] == "sft_then_grpo" and child["pipeline.stage"] == "grpo"
    parent = client.get_run(ids["sft"]).data.tags
    assert parent["algorithm"] == "sft" and "mlflow.parentRunId" not in parent
    assert [m.step for m in client.get_metric_history(ids["sft"], "sft/loss")] == [1, 2]


@pytest.mark.long
def test_grpo_then_redistill_tiny_run(tmp_path):
    """RL -> SFT of the base model on the RL policy's own correct samples (the vowel share standing in for
    correctness on the tiny model, min_score 0.3)."""
    from omegaconf import OmegaConf

    base = load_pipeline("grpo_then_redistill")
    small = ["algorithm.num_prompts=4", "algorithm.samples_per_prompt=2", "algorithm.min_score=0.3"]
    redistill = Stage("redistill", [*base.stages[1].overrides, *small], None, "grpo")
    p = Pipeline(base.name, base.path, [base.stages[0], redistill])
    out = tmp_path / "pipe"
    results = run_pipeline(p, out, [*FAST, *VARYING])
    assert [r.status for r in results] == ["trained", "trained"]
    assert (out / "grpo" / "model" / "config.json").exists()  # the RL stage's checkpoint, exported for its child
    cfg = OmegaConf.load(out / "redistill" / "config.yaml")
    assert cfg.model.source == "tiny" and Path(cfg.algorithm.teacher) == out / "grpo" / "model"
    last = json.loads((out / "redistill" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["sft/sampled"] == 8 and 0 < last["sft/examples"] <= 4
    lineage = json.loads((out / "redistill" / "pipeline.json").read_text())
    assert lineage["parent"]["stage"] == "grpo" and lineage["parent"]["as"] == "teacher"
