"""TRL's log names -> ours (rlexp.preference.metrics)."""

import math

from rlexp.preference.metrics import TRL_TO_OURS, is_summary, translate


def test_dpo_log_in_our_names():
    logs = {
        "loss": 0.69,
        "grad_norm": 2.5,
        "learning_rate": 1e-5,
        "rewards/margins": 0.1,
        "rewards/accuracies": 0.5,
        "logps/chosen": -10.0,
        "logps/rejected": -12.0,
        "entropy": 3.0,
        "epoch": 0.25,
        "something_new": 7,
    }
    out = translate(logs)
    assert out == {
        "loss/total": 0.69,
        "grad_norm": 2.5,
        "lr": 1e-5,
        "pref/reward_margin": 0.1,
        "pref/reward_accuracy": 0.5,
        "pref/chosen_logp": -10.0,
        "pref/rejected_logp": -12.0,
        "entropy/mean": 3.0,
        "pref/epoch": 0.25,
        "trl/something_new": 7.0,  # unknown keys are kept, under trl/
    }


def test_online_dpo_scores_are_our_reward_and_kl():
    out = translate({"objective/scores": 0.4, "objective/kl": 0.01, "objective/scores_margin": 0.2})
    assert out == {"reward/mean": 0.4, "kl/mean": 0.01, "pref/score_margin": 0.2}


def test_the_map_is_one_to_one_and_the_summary_is_not_a_step():
    assert len(set(TRL_TO_OURS.values())) == len(TRL_TO_OURS)
    assert is_summary({"train_runtime": 3.0, "train_loss": 0.7}) and not is_summary({"loss": 0.7})
    assert translate({"train_runtime": 3.0}) == {}
    assert math.isnan(translate({"loss": float("nan")})["loss/total"])  # a non-finite loss stays (the run stops)
    assert translate({"grad_norm": float("inf"), "note": "text"}) == {}
