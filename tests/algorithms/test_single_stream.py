"""SPO ("Single-stream Policy Optimization"): the Beta tracker, the KL-adaptive ρ, the globally normalised advantage,
the prioritised sampler's weights, and a two-step run of algorithm=spo_single_stream with sampler=spo."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.prompt_value import anchored
from rlexp.algorithms.group_stages.prompt_values import BetaTracker, SingleStreamValues, kl_rho, priority_weight
from rlexp.samplers.feedback import GroupFeedback
from rlexp.samplers.prioritized import ValuePrioritized, weighted_draw


class _Rows(SimpleNamespace):
    def __len__(self):
        return len(self.records)


def test_tracker_update_by_hand():
    t = BetaTracker(0.5, 0.5)
    assert t.value("a") == 0.5
    t.update("a", 1.0, 0.96)  # α = 0.96·0.5 + 1 = 1.48, β = 0.96·0.5 + 0 = 0.48
    assert t.alpha["a"] == pytest.approx(1.48) and t.beta["a"] == pytest.approx(0.48)
    assert t.value("a") == pytest.approx(1.48 / 1.96)
    t.update("a", 0.0, 0.875)  # α = 0.875·1.48 = 1.295, β = 0.875·0.48 + 1 = 1.42
    assert t.alpha["a"] == pytest.approx(1.295) and t.beta["a"] == pytest.approx(1.42)
    t.update("a", 3.0, 1.0)  # rewards are clipped to [0, 1] for the tracker: α = 2.295, β = 1.42
    assert t.alpha["a"] == pytest.approx(2.295) and t.beta["a"] == pytest.approx(1.42)
    s = BetaTracker()
    s.load_state_dict(t.state_dict())
    assert s.value("a") == t.value("a")


def test_kl_rho_by_hand():
    assert kl_rho(0.0, 0.06, 0.875, 0.96) == 0.96  # 2^0 = 1 → clipped to ρ_max
    assert kl_rho(0.06, 0.06, 0.875, 0.96) == 0.875  # 2^-1 = 0.5 → clipped to ρ_min
    d = -0.06 * math.log2(0.9)  # 2^(−D/0.06) = 0.9 exactly, inside the clip
    assert kl_rho(d, 0.06, 0.875, 0.96) == pytest.approx(0.9)


def test_priority_weight_by_hand():
    assert priority_weight(0.5) == pytest.approx(0.55)  # sqrt(0.25) + 0.05
    assert priority_weight(1.0) == pytest.approx(0.05) and priority_weight(0.0) == pytest.approx(0.05)
    assert priority_weight(0.1) == pytest.approx(0.3 + 0.05)  # sqrt(0.09) = 0.3


def test_global_normalisation_by_hand():
    # r = [1, 0, 1, 0], v = [0.5, 0.5, 0.8, 0.2] → r − v = [0.5, −0.5, 0.2, −0.2]; mean 0,
    # Bessel std = sqrt((0.25 + 0.25 + 0.04 + 0.04)/3) = sqrt(0.58/3)
    b = _Rows(reward=torch.tensor([1.0, 0.0, 1.0, 0.0]), extras={"prompt_value": torch.tensor([0.5, 0.5, 0.8, 0.2])})
    b.records = [{}] * 4
    adv = anchored(b, normalise="batch", eps=0.0)
    std = math.sqrt(0.58 / 3)
    assert adv.tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.2 / std, -0.2 / std], rel=1e-5)
    raw = anchored(b, normalise="none")
    assert raw.tolist() == pytest.approx([0.5, -0.5, 0.2, -0.2])
    with pytest.raises(ValueError, match="normalise"):
        anchored(b, normalise="group")
    with pytest.raises(KeyError, match="prompt_values"):
        anchored(b, key="missing")


def test_stage_with_constant_rho_by_hand():
    stage = SingleStreamValues(rho=0.5)
    recs = [{"id": "p"}, {"id": "q"}]
    b = _Rows(reward=torch.tensor([1.0, 0.0]), records=recs, extras={}, stats={})
    stage(b)
    assert b.extras["prompt_value"].tolist() == [0.5, 0.5]  # first sight: α0/(α0+β0)
    # p: α = 0.5·0.5 + 1 = 1.25, β = 0.25 → v = 1.25/1.5; q: α = 0.25, β = 1.25 → v = 0.25/1.5
    b2 = _Rows(reward=torch.tensor([0.0, 0.0]), records=recs, extras={}, stats={})
    stage(b2)
    assert b2.extras["prompt_value"].tolist() == pytest.approx([1.25 / 1.5, 0.25 / 1.5])
    assert b2.stats["spo/rho_mean"] == 0.5
    with pytest.raises(ValueError, match="rho"):
        SingleStreamValues(rho="adaptive")
    with pytest.raises(ValueError, match="rho_min"):
        SingleStreamValues(rho_min=0.99, rho_max=0.9)


def test_weighted_draw_is_distinct_and_prefers_heavy():
    rng = random.Random(0)
    counts = [0, 0, 0]
    for _ in range(2000):
        picked = weighted_draw([0.05, 0.55, 0.05], 1, rng)
        counts[picked[0]] += 1
    assert counts[1] > 5 * max(counts[0], counts[2])  # 0.55 / 0.65 ≈ 85 % of single draws
    assert sorted(weighted_draw([1.0, 1.0, 1.0], 3, rng)) == [0, 1, 2]


def test_sampler_tracks_and_weights():
    records = [{"id": str(i), "question": str(i)} for i in range(4)]
    s = ValuePrioritized(records, batch_size=2, seed=1, rho=0.5)
    assert s.weights() == pytest.approx([0.55] * 4)
    s.observe(GroupFeedback([records[0], records[1]], [1.0, 0.5]))
    # id 0: α = 1.25, β = 0.25 → p = 5/6, w = sqrt(5/36) + 0.05; id 1: α = β = 0.75 → p = 1/2, w = 0.55
    assert s.weights() == pytest.approx([math.sqrt(5 / 36) + 0.05, 0.55, 0.55, 0.55])
    batch = s.next_batch()
    assert len({r["id"] for r in batch}) == 2 and "spo_sampler/weight_mean" in s.metrics()
    t = ValuePrioritized(records, batch_size=2, seed=1, rho=0.5)
    t.load_state_dict(s.state_dict())
    assert t.next_batch() == s.next_batch()  # resumed: the same draw


@pytest.mark.long
def test_spo_single_stream_two_steps(tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    # two prompts in the split, two per step: step 2 revisits both, so the KL-adaptive ρ is measured
    result = run(
        tiny_cfg(
            *VARYING,
            "trainer.autocast=off",
            "trainer.max_new_tokens=6",
            "algorithm=spo_single_stream",
            "sampler=spo",
            "dataset.train_size=2",
        )
    )
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert m["spo/revisited_share"] == 1.0 and math.isfinite(m["spo/kl_mean"]) and m["spo/kl_mean"] >= 0
    assert 0.875 <= m["spo/rho_mean"] <= 0.96
    assert m["spo/value_mean"] != 0.5  # step 2 reads the tracker updated by step 1's rewards
    assert "sampler/spo_sampler/weight_mean" in m or "spo_sampler/weight_mean" in m
