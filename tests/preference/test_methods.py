"""Every TRL-backed preference method trains two steps on the tiny model through ``rlexp.runs.training.run`` (the
``rlexp train`` path), logging our metric names; the TRL run logs to MLflow with the provenance a GRPO run has.

The tiny model's answers are never correct, so the accuracy term is swapped for the vowel share
(tests/algorithms/varying_reward.py): completions then differ in reward and the own-rollout pairs exist."""

import json
import math
from pathlib import Path

import pytest

from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=8"]
OWN = ["dataset.num_prompts=6"]  # own-rollout pairs from 6 prompts x 4 completions


def _check(result, mechanism: str):
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert m["lr"] == pytest.approx(1e-5)
    assert mechanism in m and math.isfinite(m[mechanism]), sorted(m)
    return m


def test_dpo_two_steps_from_own_rollouts(tiny_cfg):
    cfg = tiny_cfg(*VARYING, *FAST, *OWN, "algorithm=dpo")
    result = run(cfg)
    m = _check(result, "pref/reward_margin")
    run_dir = Path(cfg.trainer.run_dir)
    rows = [json.loads(line) for line in (run_dir / "preference_pairs.jsonl").read_text().splitlines()]
    assert len(rows) == m["pref/pairs"] > 0
    assert all(r["chosen_reward"] > r["rejected_reward"] or r["chosen_length"] < r["rejected_length"] for r in rows)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert (run_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").exists()
    assert json.loads((run_dir / "provenance.json").read_text())["status"] == "FINISHED"


def test_online_dpo_two_steps_with_our_reward_terms(tiny_cfg):
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=online_dpo"))
    m = _check(result, "pref/score_margin")
    # our reward terms scored TRL's samples: the vowel share is in (0, 1) on random text, and the chosen sample
    # never has the lower reward
    assert 0 < m["reward/accuracy/mean"] < 1 and m["accuracy"] == m["reward/accuracy/mean"]
    assert m["pref/score_margin"] >= 0


@pytest.mark.long
@pytest.mark.parametrize(
    "method,mechanism",
    [("ipo", "pref/reward_margin"), ("kto", "pref/kto_kl"), ("orpo", "pref/log_odds_ratio")],
)
def test_offline_methods_two_steps(tiny_cfg, method, mechanism):
    m = _check(run(tiny_cfg(*VARYING, *FAST, *OWN, f"algorithm={method}")), mechanism)
    if method == "orpo":
        assert m["pref/nll_loss"] > 0


@pytest.mark.long
def test_dpo_loss_type_override_and_a_local_preference_file(tiny_cfg):
    fixture = Path(__file__).parents[1] / "fixtures" / "data" / "ultrafeedback_binarized_sample.jsonl"
    local = ["dataset=preference_local", f"dataset.path={fixture}", "dataset.eval_size=2"]
    cfg = tiny_cfg(*FAST, "algorithm=dpo", "algorithm.loss_type=hinge", *local)
    result = run(cfg)
    _check(result, "pref/reward_margin")
    assert "pref/pairs" not in result.metrics  # pairs from the file, none built


def test_bad_preference_settings_are_refused_naming_the_key(tiny_cfg):
    from rlexp.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match="algorithm.loss_type='kto'"):
        validate(tiny_cfg("algorithm=dpo", "algorithm.loss_type=kto"))
    with pytest.raises(ConfigError, match="algorithm.beta"):
        validate(tiny_cfg("algorithm=orpo", "algorithm.beta=-1"))
    with pytest.raises(ConfigError, match="algorithm.options.learning_rate"):
        validate(tiny_cfg("algorithm=kto", "+algorithm.options.learning_rate=0.1"))


@pytest.mark.long
def test_trl_run_logs_to_mlflow_with_our_names_and_provenance(tiny_cfg, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from rlexp.tracking.provenance import collect_provenance, run_tags

    db = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", db)
    cfg = tiny_cfg(*VARYING, *FAST, *OWN, "algorithm=dpo", "tracker=mlflow")
    result = run(cfg)
    assert result.last_step == 2
    run_dir = Path(cfg.trainer.run_dir)
    run_id = json.loads((run_dir / "tracker_ids.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=db)
    mr = client.get_run(run_id)
    assert mr.info.status == "FINISHED"
    for key in ("loss/total", "grad_norm", "lr", "time/step_s", "pref/reward_margin", "pref/reward_accuracy"):
        assert [m.step for m in client.get_metric_history(run_id, key)] == [1, 2], key
    # the tags a GRPO run gets (rlexp.tracking.provenance.run_tags) and the run identity
    expected = run_tags(cfg, collect_provenance(cfg, run_dir), run_dir)
    missing = sorted(set(expected) - set(mr.data.tags))
    assert not missing, missing
    uid = json.loads((run_dir / "run.json").read_text())["uid"]
    assert mr.data.tags["algorithm"] == "dpo" and mr.data.tags["run_uid"] == uid
    assert mr.data.params["algorithm.beta"] == "0.1" and mr.data.params["algorithm.trainer"] == "dpo"
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "provenance.json"} <= artifacts
