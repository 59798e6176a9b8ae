"""GRPO-S of DR-IRL (arXiv 2503.18991): rewards scaled by 1 + α·h_data + β·h_model per prompt group (our formula)."""

import math

import pytest
import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.algorithms.group_stages.difficulty_scaling import DifficultyScaling
from tests.algorithms.batches import make_batch


def _acc(rewards, groups):
    b = make_batch(rewards, groups)
    b.reward_names = ["accuracy"]
    return b


def test_scale_at_easy_and_hard_prompts():
    # group 0 [1, .5]: failure rate 1 − .75 = .25, gap .5; group 1 [0, 0]: failure 1, gap 0; batch span 1
    # h_model: 1 − .5/1 = .5 and 1 − 0 = 1; s = 1 + .5·.25 + .5·.5 = 1.375 and 1 + .5·1 + .5·1 = 2
    b = _acc([1.0, 0.5, 0.0, 0.0], [0, 0, 1, 1])
    DifficultyScaling(alpha=0.5, beta=0.5)(b)
    assert b.reward.tolist() == pytest.approx([1.375, 0.6875, 0.0, 0.0])
    assert b.term("accuracy").tolist() == [1.0, 0.5, 0.0, 0.0]  # the term column stays raw
    assert b.stats["grpo_scaling/scale_mean"] == pytest.approx((2 * 1.375 + 2 * 2.0) / 4)
    assert b.stats["grpo_scaling/scale_max"] == pytest.approx(2.0)
    assert b.stats["grpo_scaling/hardness_mean"] == pytest.approx(0.625)
    assert b.stats["grpo_scaling/unresponsive_mean"] == pytest.approx(0.75)


def test_hard_prompt_gets_larger_advantages_under_the_batch_std():
    # same gap (.5) in both groups, so the same h_model = .5; failure .25 (easy) vs .75 (hard):
    # s = 1.375 vs 1.625; centred advantages ±.25·s, divided by one batch std: ratio 1.625/1.375
    b = _acc([1.0, 0.5, 0.5, 0.0], [0, 0, 1, 1])
    DifficultyScaling(alpha=0.5, beta=0.5)(b)
    assert b.reward.tolist() == pytest.approx([1.375, 0.6875, 0.8125, 0.0])
    adv = normalize_rewards(b.reward, b.group_ids, scale="batch")
    assert float(adv[2] / adv[0]) == pytest.approx(1.625 / 1.375)
    # under GRPO's group std the scale cancels (why grpo_scaling.yaml divides by the batch std)
    group = normalize_rewards(b.reward, b.group_ids, scale="group")
    assert float(group[2] / group[0]) == pytest.approx(1.0, abs=1e-5)


def test_running_hardness_and_edge_cases():
    stage = DifficultyScaling(alpha=1.0, beta=0.0, hardness="running")
    stage(_acc([1.0, 0.5, 1.0, 1.0], [0, 0, 1, 1]))  # q0 fails .25, q1 fails 0
    b = _acc([0.5, 0.0, 1.0, 1.0], [0, 0, 1, 1])  # q0 fails .75 now: running (.25 + .75)/2 = .5
    stage(b)
    assert b.reward.tolist() == pytest.approx([0.5 * 1.5, 0.0, 1.0, 1.0])
    again = DifficultyScaling(hardness="running")
    again.load_state_dict(stage.state_dict())
    assert again.history == {"q0": [1.0, 2], "q1": [0.0, 2]}
    flat = _acc([1.0, 1.0, 1.0, 1.0], [0, 0, 1, 1])  # no reward spread in the batch: h_model = 0
    DifficultyScaling(alpha=0.0, beta=1.0)(flat)
    assert flat.reward.tolist() == [1.0] * 4 and math.isfinite(flat.stats["grpo_scaling/scale_mean"])
    with pytest.raises(ValueError, match="hardness"):
        DifficultyScaling(hardness="clip")
    with pytest.raises(KeyError, match="hardness_term"):
        DifficultyScaling(hardness_term="nope")(_acc([1.0, 0.0], [0, 0]))
    assert torch.isfinite(b.reward).all()


def test_grpo_scaling_trains_two_steps(tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=4"]
    m = run(tiny_cfg(*VARYING, *fast, "algorithm=grpo_scaling")).metrics
    # the vowel share is never 1: every prompt has failure rate > 0, so the scale is above 1
    assert m["grpo_scaling/scale_mean"] > 1.0 and m["grpo_scaling/hardness_mean"] > 0
    assert m["grpo_scaling/scale_max"] <= 2.0 + 1e-6 and m["advantage/abs_mean"] > 0
