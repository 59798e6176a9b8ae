"""GRPO-λ switch (rlexp.algorithms.group_stages.length_switch), values computed by hand."""

import json
import math

import pytest
import torch
from hydra.utils import instantiate

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.algorithms.group_stages.length_switch import LambdaSwitch, penalised_groups
from rlexp.core.batch import RolloutBatch
from rlexp.runs.training import run


def make_batch(acc, lengths, groups):
    n, t = len(acc), max(lengths)
    mask = torch.tensor([[1] * l + [0] * (t - l) for l in lengths])
    acc_t = torch.tensor(acc, dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.ones(n, t, dtype=torch.long),
        completion_mask=mask,
        sampling_logprobs=torch.zeros(n, t),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        prompts=["p"] * n,
        completions=["c"] * n,
        records=[{}] * n,
        rewards=acc_t[:, None].clone(),
        reward_names=["accuracy"],
        reward_weights=torch.tensor([1.0]),
        reward=acc_t.clone(),
        reward_failures=torch.zeros(n, 1, dtype=torch.bool),
    )


def test_threshold_keeps_the_penalty_at_and_above_and_switches_below():
    ratios = torch.tensor([0.25, 0.5, 0.75, 0.0, 0.49])
    assert penalised_groups(ratios, threshold=0.5).tolist() == [False, True, True, False, False]


def test_top_fraction_selects_the_highest_ratios_ties_in_order():
    assert penalised_groups(torch.tensor([0.5, 1.0, 0.5, 0.75]), 0.0, 0.5).tolist() == [False, True, False, True]
    assert penalised_groups(torch.tensor([0.5, 0.5, 0.5, 0.0]), 0.0, 0.5).tolist() == [True, True, False, False]
    # ceil(0.75 * 4) = 3 candidates (idx 1, 3, 0), then the threshold 0.6 removes idx 0
    assert penalised_groups(torch.tensor([0.5, 1.0, 0.5, 0.75]), 0.6, 0.75).tolist() == [False, True, False, True]
    # ceil(0.2 * 4) = 1 (at least one group), ceil(0.2 * 8) = 2, ceil(0.2 * 5) = 1; λ = 0: none
    assert penalised_groups(torch.tensor([0.5, 1.0, 0.5, 0.75]), 0.0, 0.2).tolist() == [False, True, False, False]
    assert penalised_groups(torch.arange(8.0) / 8, 0.0, 0.2).tolist() == [False] * 6 + [True, True]
    assert penalised_groups(torch.arange(5.0) / 5, 0.0, 0.2).tolist() == [False] * 4 + [True]
    assert not penalised_groups(torch.ones(3), 0.0, 0.0).any()


def sig(x):
    return 1 / (1 + math.exp(-x))


def test_paper_default_top_lambda_groups_get_the_sigmoid_length_reward_by_hand():
    """GRPO-λ (the method section as restated in jianzhnie/llmtech docs/rlhf/paper/GRPO-lambda.md): the top-λ
    groups by correctness ratio get r = 1 − α·σ((L − mean_c)/std_c) on correct completions and 0 on wrong ones,
    the others 0/1. λ = 0.4 of 5 groups: the groups of ratio 1.0 (group 2) and 0.75 (group 0)."""
    acc = [1, 1, 1, 0] + [1, 0, 0, 0] + [1, 1, 1, 1] + [0, 0, 0, 0] + [1, 1, 0, 0]
    lengths = [10, 20, 30, 5] + [8, 9, 9, 9] + [10, 20, 30, 40] + [3, 3, 3, 3] + [6, 12, 3, 3]
    batch = make_batch(acc, lengths, [g for g in range(5) for _ in range(4)])
    out = LambdaSwitch(top_fraction=0.4, weight=0.6)(batch)
    # group 0: correct lengths 10, 20, 30: mean 20, population std sqrt(200/3) = 8.165 -> z = ∓1.2247, 0
    s0 = math.sqrt(200 / 3)
    # group 2: lengths 10..40: mean 25, std sqrt(125) = 11.18 -> z = ∓1.342, ∓0.447
    s2 = math.sqrt(125)
    raw = [-sig(-10 / s0), -0.5, -sig(10 / s0), 0.0] + [0.0] * 4
    raw += [-sig(-15 / s2), -sig(-5 / s2), -sig(5 / s2), -sig(15 / s2)] + [0.0] * 8
    assert out.term("length_penalty").tolist() == pytest.approx(raw, abs=1e-6)
    assert out.reward.tolist() == pytest.approx([a + 0.6 * r for a, r in zip(acc, raw)], abs=1e-6)
    assert out.reward[8:12].tolist() == pytest.approx([0.8757, 0.7660, 0.6340, 0.5243], abs=1e-4)  # 1 − 0.6σ(z)
    assert out.extras["lambda_penalised"].tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [False] * 8
    assert out.stats["grpo_lambda/switched_group_frac"] == pytest.approx(0.6)
    # the default λ = 0.2 of 5 groups: only group 2; a group with one correct completion (std 0) gets z = 0
    only = LambdaSwitch()(make_batch(acc, lengths, [g for g in range(5) for _ in range(4)]))
    assert only.extras["lambda_penalised"].tolist() == [False] * 8 + [True] * 4 + [False] * 8
    one = LambdaSwitch(top_fraction=1.0)(make_batch([1, 0, 0], [7, 3, 9], [0, 0, 0]))
    assert one.reward.tolist() == pytest.approx([1 - 0.6 * 0.5, 0.0, 0.0])
    # an all-correct group: 0/1 gives it no advantage; the length reward ranks its completions, shorter first
    from rlexp.algorithms.advantages.group import grpo

    assert (grpo(out)[8:12].diff() < 0).all()


def test_switch_on_a_hand_made_batch():
    batch = make_batch(
        acc=[1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 0],
        lengths=[10, 20, 40, 30, 5, 10, 15, 20, 8, 16, 4, 12],
        groups=[0] * 4 + [1] * 4 + [2] * 4,
    )
    out = LambdaSwitch(penalty="kimi", threshold=0.5, top_fraction=None, weight=1.0)(batch)  # the old default
    # group 0: ratio 0.75 >= 0.5, penalised. span 30: lambda = [0.5, 1/6, -0.5, -1/6]; the wrong row gets min(0, -1/6)
    # group 1: ratio 0.25 < 0.5, switched: plain 0/1
    # group 2: ratio 0.5 (at the threshold), penalised. span 12: lambda = [1/6, -0.5, 0.5, -1/6]; wrong rows: 0, -1/6
    pen = [0.5, 1 / 6, -0.5, -1 / 6, 0, 0, 0, 0, 1 / 6, -0.5, 0.0, -1 / 6]
    acc = [1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 0]
    assert out.reward_names == ["accuracy", "length_penalty"]
    assert out.term("length_penalty").tolist() == pytest.approx(pen, abs=1e-6)
    assert out.reward.tolist() == pytest.approx([a + p for a, p in zip(acc, pen)], abs=1e-6)
    assert out.reward_weights.tolist() == [1.0, 1.0]
    assert out.reward_failures.shape == (12, 2)
    assert out.extras["lambda_penalised"].tolist() == [True] * 4 + [False] * 4 + [True] * 4
    s = out.stats
    assert s["grpo_lambda/switched_group_frac"] == pytest.approx(1 / 3)
    assert s["grpo_lambda/correct_ratio_mean"] == pytest.approx(0.5)
    assert s["grpo_lambda/correct_length_mean"] == pytest.approx((10 + 20 + 40 + 5 + 8 + 16) / 6)
    assert s["grpo_lambda/penalty_mean"] == pytest.approx(-0.5 / 12)
    assert len(out.select([0, 5])) == 2  # extras stay per-row


def test_weight_scales_the_added_penalty():
    batch = make_batch(acc=[1, 1], lengths=[2, 4], groups=[0, 0])
    out = LambdaSwitch(penalty="kimi", threshold=1.0, top_fraction=None, weight=0.5)(batch)
    # ratio 1.0 >= 1.0: penalised; lambda = [0.5, -0.5]; reward = 1 + 0.5 * lambda
    assert out.reward.tolist() == pytest.approx([1.25, 0.75])
    assert out.term("length_penalty").tolist() == pytest.approx([0.5, -0.5])


def test_no_correct_answer_logs_nan_length():
    out = LambdaSwitch()(make_batch(acc=[0, 0], lengths=[2, 4], groups=[0, 0]))
    assert out.stats["grpo_lambda/switched_group_frac"] == 0.0  # the one group is the top λ, but nothing to shorten
    assert out.stats["grpo_lambda/correct_length_mean"] != out.stats["grpo_lambda/correct_length_mean"]
    assert out.reward.tolist() == [0.0, 0.0]


def test_errors_name_the_key():
    with pytest.raises(ValueError, match="LambdaSwitch.threshold"):
        LambdaSwitch(threshold=1.5)
    with pytest.raises(ValueError, match="LambdaSwitch.top_fraction"):
        LambdaSwitch(top_fraction=2.0)
    with pytest.raises(ValueError, match="LambdaSwitch.penalty"):
        LambdaSwitch(penalty="linear")
    with pytest.raises(KeyError, match="LambdaSwitch.accuracy_term"):
        LambdaSwitch(accuracy_term="acc")(make_batch([1], [1], [0]))
    batch = append_reward_column(make_batch([1, 0], [1, 2], [0, 0]), "length_penalty", torch.zeros(2))
    with pytest.raises(ValueError, match="LambdaSwitch.name"):  # e.g. algorithm=grpo_lambda with reward=length_penalty
        LambdaSwitch()(batch)


def test_config_composes_to_the_switch(tiny_cfg):
    algo = instantiate(tiny_cfg("algorithm=grpo_lambda").algorithm, _convert_="all")
    (stage,) = algo.group_stages
    assert isinstance(stage, LambdaSwitch)
    assert (stage.penalty, stage.threshold, stage.top_fraction, stage.weight, stage.correct_min) == (
        "sigmoid", 0.0, 0.2, 0.6, 1.0,
    )  # fmt: skip
    assert not algo.needs_reference and algo.kl.coef == 0


def test_grpo_lambda_trains_two_steps_and_logs_its_metrics(tiny_cfg, tmp_path):
    result = run(tiny_cfg("algorithm=grpo_lambda", "prompt=hash"))
    assert result.last_step == 2
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in (
            "grpo_lambda/switched_group_frac",
            "grpo_lambda/correct_length_mean",
            "grpo_lambda/correct_ratio_mean",
            "reward/length_penalty/mean",
        ):
            assert key in row, key
        assert 0.0 <= row["grpo_lambda/switched_group_frac"] <= 1.0


def test_kimi_long2short_experiment_trains_with_the_length_reward_and_a_shorter_limit(tiny_cfg):
    from omegaconf import OmegaConf

    from rlexp.config.paths import CONF_DIR

    assert OmegaConf.load(f"{CONF_DIR}/experiment/kimi_long2short.yaml").trainer.max_new_tokens == 64
    cfg = tiny_cfg("+experiment=kimi_long2short", "trainer.autocast=off")  # the tiny run keeps its 12 tokens
    assert "length_penalty" in cfg.reward.terms
    assert cfg.prompt.answer_format == "tag"
    result = run(cfg)
    assert result.last_step == 2 and "reward/length_penalty/mean" in result.metrics
