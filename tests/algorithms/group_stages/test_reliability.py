"""The reward-reliability filters of rlexp.algorithms.group_stages.filters, worked out by hand: PF-PPO's policy
filtration (each group's best and worst rows) and ReST-GRPO's reward-std filter (groups whose population std reaches
the threshold), then two training steps of algorithm=pf_ppo and algorithm=rest_grpo on the tiny model."""

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.filters import (
    pf_keep,
    policy_filtration,
    population_std,
    r_squared,
    reward_std_filter,
)
from rlexp.core.masks import LOSS_MASK
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING

# group 0 ranks rows 1 (0.9), 2 (0.5), 0 (0.2), 3 (0.1); group 1 ranks 6 (0.7), 7 (0.6), 4 (0.3), 5 (0.3): a tie
# keeps row order, so row 5 is group 1's worst
REWARDS = [0.2, 0.9, 0.5, 0.1, 0.3, 0.3, 0.7, 0.6]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]


def ctx_with(sample=None, step=0, **settings):
    return SimpleNamespace(settings=SimpleNamespace(**settings), sample=sample, step=step)


class Refills:
    """ctx.sample stand-in: hands out prepared batches and records how many prompts were asked."""

    def __init__(self, *batches):
        self.batches, self.asked = list(batches), []

    def __call__(self, n):
        self.asked.append(n)
        b = self.batches.pop(0)
        b.stats["time/reward_s"] = 0.25
        return b


# ---- PF-PPO ----------------------------------------------------------------------------------------------------------
def test_best_worst_keeps_each_groups_extremes():
    out = policy_filtration(make_batch(REWARDS, GROUPS), ctx_with())
    assert out.reward.tolist() == pytest.approx([0.9, 0.1, 0.3, 0.7])  # rows 1, 3 | 5, 6, in row order
    assert out.group_ids.tolist() == [0, 0, 1, 1]
    s = out.stats
    assert (s["pfppo/kept_rows"], s["pfppo/dropped_rows"], s["pfppo/kept_frac"]) == (4.0, 4.0, 0.5)
    assert s["pfppo/reward_kept_mean"] == pytest.approx((0.9 + 0.1 + 0.3 + 0.7) / 4)  # 0.5
    assert s["pfppo/reward_dropped_mean"] == pytest.approx((0.2 + 0.5 + 0.3 + 0.6) / 4)  # 0.4, the middle


def test_best_of_n_and_best_random():
    assert pf_keep(REWARDS, GROUPS, "best_of_n", 1, None) == [1, 6]
    assert pf_keep(REWARDS, GROUPS, "best_worst", 1, None) == [1, 3, 5, 6]
    picked = pf_keep(REWARDS, GROUPS, "best_random", 1, random.Random(0))
    # the best of each group (1, 6) and one of its other three rows
    assert {1, 6} <= set(picked) and len(picked) == 4
    assert len(set(picked) & {0, 2, 3}) == 1 and len(set(picked) & {4, 5, 7}) == 1
    assert picked == pf_keep(REWARDS, GROUPS, "best_random", 1, random.Random(0))  # seeded
    # k = 2 of 5 rows: the two best and the two worst; a group of 3 (≤ 2k) is kept whole
    assert pf_keep([5, 1, 3, 4, 2, 7, 8, 9], [0, 0, 0, 0, 0, 1, 1, 1], "best_worst", 2, None) == [0, 1, 3, 4, 5, 6, 7]


def test_r_squared_by_hand():
    # x = 0..3, y = 0 1 0 1: Σdx·dy = 1.0, Σdx² = 5, Σdy² = 1 → R² = 1/5
    assert r_squared(torch.tensor([0.0, 1, 2, 3]), torch.tensor([0.0, 1, 0, 1])) == pytest.approx(0.2)
    assert r_squared(torch.tensor([0.0, 1, 2]), torch.tensor([1.0, 3, 5])) == pytest.approx(1.0)
    assert r_squared(torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])) is None  # x does not vary


def test_r_squared_against_an_actual_score_term():
    # the ranked reward t0 = 0 1 2 3 (t1 at weight 0 is the actual score 0 1 0 1): BW keeps rows 0 and 3, on which
    # the score follows the reward exactly (R² = 1); over all four rows R² = 0.2
    batch = make_batch(None, [0, 0, 0, 0], terms=[[0, 0], [1, 1], [2, 0], [3, 1]], weights=[1.0, 0.0])
    out = policy_filtration(batch, ctx_with(), metric="t0", score_term="t1")
    assert out.stats["pfppo/r2_kept"] == pytest.approx(1.0) and out.stats["pfppo/r2_all"] == pytest.approx(0.2)


def test_policy_filtration_refuses_what_filters_nothing():
    with pytest.raises(ValueError, match=r"keeps 2 completions of each group, but the groups hold at most 2.*"):
        policy_filtration(make_batch([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]), ctx_with())
    with pytest.raises(ValueError, match=r"trainer\.num_generations above 4"):
        policy_filtration(make_batch(REWARDS, GROUPS), ctx_with(), k=2)
    with pytest.raises(ValueError, match=r"policy_filtration\.strategy='top'"):
        policy_filtration(make_batch(REWARDS, GROUPS), ctx_with(), strategy="top")
    with pytest.raises(ValueError, match=r"policy_filtration\.k=0"):
        policy_filtration(make_batch(REWARDS, GROUPS), ctx_with(), k=0)


# ---- ReST-GRPO ---------------------------------------------------------------------------------------------------
# population std per group: g0 1 0 1 0 → 0.5; g1 .5 .5 .5 .5625 → √(0.0029296875/4) ≈ 0.02706; g2 constant → 0;
# g3 0 .25 0 .25 → 0.125 (with Bessel's correction it would be 0.1443)
STD_REWARDS = [1, 0, 1, 0, 0.5, 0.5, 0.5, 0.5625, 0.25, 0.25, 0.25, 0.25, 0, 0.25, 0, 0.25]
STD_GROUPS = [g for g in range(4) for _ in range(4)]


def test_population_std_by_hand():
    stds = population_std(torch.tensor(STD_REWARDS), torch.tensor(STD_GROUPS))
    assert stds == pytest.approx({0: 0.5, 1: math.sqrt(0.0029296875 / 4), 2: 0.0, 3: 0.125})


def test_reward_std_filter_keeps_the_groups_that_vary_enough():
    out = reward_std_filter(make_batch(STD_REWARDS, STD_GROUPS), ctx_with(prompts_per_step=4))
    assert out.group_ids.tolist() == [0] * 4 + [3] * 4
    s = out.stats
    assert (s["restrl/kept_groups"], s["restrl/dropped_groups"], s["restrl/kept_frac"]) == (2.0, 2.0, 0.5)
    assert s["restrl/reward_std_mean"] == pytest.approx((0.5 + math.sqrt(0.0029296875 / 4) + 0 + 0.125) / 4)
    assert s["restrl/kept_std_mean"] == pytest.approx((0.5 + 0.125) / 2) and s["restrl/rounds"] == 0
    # the bar is inclusive (g3's 0.125 passes 0.125) and uses no Bessel correction (0.13 drops g3)
    at = reward_std_filter(make_batch(STD_REWARDS, STD_GROUPS), ctx_with(prompts_per_step=4), min_std=0.125)
    assert at.group_ids.unique().tolist() == [0, 3]
    above = reward_std_filter(make_batch(STD_REWARDS, STD_GROUPS), ctx_with(prompts_per_step=4), min_std=0.13)
    assert above.group_ids.unique().tolist() == [0]


def test_reward_std_filter_refills_when_asked():
    refill = Refills(make_batch([0.0, 1.0], [7, 7]))  # std 0.5: kept
    batch = make_batch([1, 0, 0.5, 0.5], [0, 0, 1, 1])  # group 1 constant
    out = reward_std_filter(batch, ctx_with(refill, prompts_per_step=2), max_rounds=2)
    assert refill.asked == [1] and out.group_ids.tolist() == [0, 0, 7, 7]
    s = out.stats
    assert (s["restrl/rounds"], s["restrl/sampled_groups"], s["restrl/kept_groups"], s["restrl/dropped_groups"]) == (
        1.0,
        3.0,
        2.0,
        1.0,
    )
    assert s["restrl/reward_std_mean"] == pytest.approx(0.25)  # the step's own groups: (0.5 + 0) / 2
    assert s["time/reward_s"] == 0.25


def test_reward_std_filter_with_no_passing_group_trains_on_nothing():
    out = reward_std_filter(make_batch([0.5, 0.5, 1, 1], [0, 0, 1, 1]), ctx_with(prompts_per_step=2))
    assert len(out) == 4 and out.extras[LOSS_MASK].tolist() == [0.0] * 4
    assert out.stats["restrl/kept_groups"] == 0 and out.stats["restrl/kept_frac"] == 0
    assert "restrl/kept_std_mean" not in out.stats


def test_reward_std_filter_bad_settings():
    batch = make_batch([0, 1], [0, 0])
    with pytest.raises(ValueError, match=r"reward_std_filter\.min_std=-0\.1"):
        reward_std_filter(batch, ctx_with(prompts_per_step=1), min_std=-0.1)
    with pytest.raises(ValueError, match=r"reward_std_filter\.max_rounds=-1"):
        reward_std_filter(batch, ctx_with(prompts_per_step=1), max_rounds=-1)


# ---- two training steps on the tiny model ------------------------------------------------------------------------
FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=4"]


@pytest.mark.long  # PPO's critic and 4 mini-batch steps: ~15-20 s on a shared 2-core CPU
def test_pf_ppo_trains_two_steps_on_each_groups_extremes(tiny_cfg):
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=pf_ppo")).metrics
    # 2 prompts × 4 completions: BW keeps 2 of each group
    assert m["pfppo/kept_rows"] == 4.0 and m["pfppo/dropped_rows"] == 4.0 and m["pfppo/kept_frac"] == 0.5
    assert m["pfppo/reward_kept_mean"] != m["pfppo/reward_dropped_mean"]
    assert m["advantage/abs_mean"] > 0 and m["critic/value_loss"] > 0 and math.isfinite(m["loss/total"])


def test_rest_grpo_trains_two_steps_on_the_varied_groups(tiny_cfg):
    """The tiny model's vowel shares vary little within a group (std ~0.02-0.05): the 0.05 bar drops some groups
    and keeps others over the two steps (seed 0: none of 2, then 1 of 2)."""
    cfg = tiny_cfg(*VARYING, *FAST, "algorithm=rest_grpo")
    result = run(cfg)
    rows = [json.loads(line) for line in (Path(cfg.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "restrl/kept_groups" in r]
    assert result.last_step == 2 and len(steps) == 2
    for r in steps:
        assert r["restrl/sampled_groups"] == 2.0 and r["restrl/kept_groups"] + r["restrl/dropped_groups"] == 2.0
        assert r["restrl/reward_std_mean"] > 0 and math.isfinite(r["loss/total"])
        if r["restrl/kept_groups"]:
            assert r["restrl/kept_std_mean"] >= 0.05
    assert sum(r["restrl/kept_groups"] for r in steps) >= 1 and sum(r["restrl/dropped_groups"] for r in steps) >= 1


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_rest_grpo_steps_when_no_group_passes(tiny_cfg):
    """A bar no group reaches (rewards in [0, 1]: std ≤ 0.5): every row at loss weight 0, the run still steps."""
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=rest_grpo", "algorithm.group_stages.0.min_std=0.6")).metrics
    assert m["restrl/kept_groups"] == 0.0 and math.isfinite(m["loss/total"])
