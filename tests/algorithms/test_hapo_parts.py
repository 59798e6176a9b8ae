"""HAPO's advantage and loss parts (issue 21), worked by hand: the token-level group average with its GRPO fallback,
the asymmetric adaptive clip ranges, the differential advantage redistribution and the whole loss."""

import math

import pytest
import torch

from rlexp.algorithms.advantages.token_group import token_group_average
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.entropy_adaptive import adaptive_clip_ranges, hapo_clip, redistributed_advantages
from tests.algorithms.batches import make_batch


def test_token_group_average_weights_completions_by_their_tokens():
    # group 0: rewards (1, 0), lengths (3, 1): μ = (3·1 + 1·0)/4 = 0.75; σ² = (3·0.25² + 1·0.75²)/4 = 0.1875,
    # σ = 0.4330127; A = 0.25/σ = 0.577350, −0.75/σ = −1.732051 (GRPO would give ±0.707107)
    # group 1: rewards (1, 0), lengths (30, 1): μ = 30/31, σ = 0.176686, the short row's A = −5.477 → |A| ≥ 5: the
    # group falls back to GRPO's ±0.707107
    batch = make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], lengths=[3, 1, 30, 1])
    adv = token_group_average(batch)
    assert adv.shape == (4, 30)
    first = adv[:, 0]
    assert torch.allclose(first, torch.tensor([0.577350, -1.732051, 0.707107, -0.707107]), atol=1e-5)
    assert torch.equal(adv != 0, batch.completion_mask.bool())  # per token, on the valid tokens
    assert batch.stats["hapo/fallback_group_frac"] == 0.5


def test_token_group_average_centres_only_and_handles_equal_rewards():
    # scale none: r − μ = 0.25, −0.75; a group of equal rewards: 0 (no division by a zero σ)
    batch = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1], lengths=[3, 1, 2, 2])
    adv = token_group_average(batch, scale="none")[:, 0]
    assert torch.allclose(adv, torch.tensor([0.25, -0.75, 0.0, 0.0]))
    with pytest.raises(ValueError, match="algorithm.advantage.scale"):
        token_group_average(batch, scale="batch")


def test_adaptive_clip_ranges_by_hand():
    # ε 0.2 / 0.2, α = 1: the lower range × (1 − ĥ) where ĥ ≤ 0, the upper one × (1 + ĥ) where ĥ > 0
    h = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
    low, high = adaptive_clip_ranges(h, 0.2, 0.2, 1.0)
    assert torch.allclose(low, torch.tensor([0.4, 0.3, 0.2, 0.2, 0.2]))
    assert torch.allclose(high, torch.tensor([0.2, 0.2, 0.2, 0.3, 0.4]))


def test_redistributed_advantages_by_hand():
    # neutral zones (1 − low/2, 1 + high/2) with the ranges above: (0.8, 1.1), (0.85, 1.1), (0.9, 1.1), (0.9, 1.15),
    # (0.9, 1.2); ratios 1, 1.2, 1, 1, 1.3 → inside, outside, inside, inside, outside
    # ĥ ≤ 0 inside → ×(1 + ĥ): 0 and 1 (ĥ = 0); ĥ ≤ 0 outside → kept; ĥ > 0 inside → kept; ĥ > 0 outside → ×2
    h = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
    low, high = adaptive_clip_ranges(h, 0.2, 0.2, 1.0)
    ratio = torch.tensor([1.0, 1.2, 1.0, 1.0, 1.3])
    adv, factor = redistributed_advantages(torch.ones(5), h, ratio, low, high, 1.0)
    assert torch.allclose(factor, torch.tensor([0.0, 1.0, 1.0, 1.0, 2.0]))
    assert torch.allclose(adv, factor)


def test_hapo_loss_by_hand():
    # log-entropies 0..4 → ĥ = −1, −2/3, −1/3, 0, 1 (tests/core/test_entropy.py); α = β = 1, ε 0.2 / 0.2:
    # ε_low = 0.4, 1/3, 0.26667, 0.2, 0.2; ε_high = 0.2, 0.2, 0.2, 0.2, 0.4
    # t0: A = −1, r = 0.7: outside (0.8, 1.1), A kept; bounds [0.6, 1.2] let 0.7 through: loss 0.7 (plain PPO: 0.8)
    # t1: A = 1, r = 1 inside: A·(1 − 2/3) → loss −1/3; t2: A·(1 − 1/3) → −2/3; t3: ĥ = 0 → −1
    # t4: A = 1, r = 1.3 outside (0.9, 1.2): A·2; bound 1.4 lets 1.3 through: loss −2.6 (plain PPO: −1.2)
    entropy = torch.exp(torch.arange(5.0))[None]
    ratio = torch.tensor([[0.7, 1.0, 1.0, 1.0, 1.3]])
    logp = ratio.log().requires_grad_()
    out = hapo_clip(logp, torch.zeros(1, 5), torch.tensor([[-1.0, 1, 1, 1, 1]]), torch.ones(1, 5), entropy)
    assert torch.allclose(out.per_token.detach(), torch.tensor([[0.7, -1 / 3, -2 / 3, -1.0, -2.6]]), atol=1e-6)
    assert torch.allclose(out.token_stats["hapo/advantage_factor"], torch.tensor([[1.0, 1 / 3, 2 / 3, 1.0, 2.0]]))
    assert torch.allclose(out.token_stats["hapo/clip_low"], torch.tensor([[0.4, 1 / 3, 0.8 / 3, 0.2, 0.2]]))
    assert out.token_stats["hapo/high_entropy_frac"].tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    out.per_token.sum().backward()  # d(−A·r)/d log π = −A·r on unclipped tokens: 0.7, −1/3, −2/3, −1, −2.6
    assert torch.allclose(logp.grad, torch.tensor([[0.7, -1 / 3, -2 / 3, -1.0, -2.6]]), atol=1e-6)


def test_hapo_loss_dual_clip_and_plain_ppo():
    # A = −1 and r = e^3 = 20.09: the surrogate 20.09 is capped at c·|A| = 10
    one = hapo_clip(torch.tensor([[3.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), torch.ones(1, 1))
    assert float(one.per_token) == pytest.approx(10.0)
    # both parts off: verl's PPO clip with the dual clip
    torch.manual_seed(0)
    logp, old = torch.randn(3, 6) * 0.3, torch.randn(3, 6) * 0.3
    adv, mask, ent = torch.randn(3), torch.ones(3, 6), torch.rand(3, 6) + 0.1
    out = hapo_clip(logp, old, adv, mask, ent, adaptive_clip=False, adaptive_advantage=False, dual_clip=3.0)
    ref = ppo_clip(logp, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    assert torch.allclose(out.per_token, ref.per_token)
    with pytest.raises(ValueError, match="dual_clip"):
        hapo_clip(logp, old, adv, mask, ent, dual_clip=1.0)


def test_released_sign_widens_the_upper_range_everywhere():
    # the release's ĥ ≥ 0: every token but the pivot gets ε_high·(1 + ĥ) and keeps ε_low
    out = hapo_clip(
        torch.zeros(1, 5), torch.zeros(1, 5), torch.ones(1), torch.ones(1, 5), torch.exp(torch.arange(5.0))[None],
        released_sign=True,
    )  # fmt: skip
    assert torch.allclose(out.token_stats["hapo/clip_low"], torch.full((1, 5), 0.2))
    assert torch.allclose(out.token_stats["hapo/clip_high"], torch.tensor([[0.4, 0.2 * 5 / 3, 0.2 * 4 / 3, 0.2, 0.4]]))
    assert math.isclose(float(out.token_stats["hapo/high_entropy_frac"].sum()), 4.0)
