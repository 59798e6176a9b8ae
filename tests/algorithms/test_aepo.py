"""AEPO (arXiv 2510.14545): the entropy-balanced clipping's values and gradients, and the entropy-aware advantage."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.entropy_weighted import aepo
from rlexp.algorithms.losses.gradient_preserving import aepo_clip, ce_gppo
from rlexp.core.masks import TOKEN_ENTROPY
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


def released_loss(logp, old_logp, adv, eps_low=0.2, eps_high=0.2, c=3.0):
    """The released per-token loss, transcribed (compute_policy_loss_entropy_balanced_clipping with
    enable_entropy_balanced_clipping, before aggregation): torch.clamp with a stop-gradient upper bound."""
    ratio = torch.exp(logp - old_logp)
    pg1 = -adv * ratio
    min_bound = torch.full_like(ratio, 1 - eps_low)
    max_bound = (1 + eps_high) / ratio.detach() * ratio
    pg2 = -adv * torch.clamp(ratio, min_bound, max_bound)
    clip1 = torch.maximum(pg1, pg2)
    return torch.where(adv < 0, torch.minimum(-adv * c, clip1), clip1)


def test_aepo_clip_by_hand():
    # ε = 0.2, c = 3; tokens: (A, r) = (+1, 1.5) clipped high, (+1, 1.1) inside, (−1, 0.5) clipped low,
    # (−1, 4) dual clip, (−1, 1.5) above the range with A < 0 (PPO does not clip it), (+1, 0.5) below with A > 0
    r = torch.tensor([[1.5, 1.1, 0.5, 4.0, 1.5, 0.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 1.0]])
    old = torch.zeros_like(r)
    logp = torch.log(r).requires_grad_(True)
    out = aepo_clip(logp, old, adv, torch.ones_like(r))
    # values: PPO's −min(rA, clip(r)A) with the dual clip: −1.2, −1.1, 0.8, 3, 1.5, −0.5
    assert out.per_token[0].tolist() == pytest.approx([-1.2, -1.1, 0.8, 3.0, 1.5, -0.5], abs=1e-6)
    out.per_token.sum().backward()
    # d/dlog π: the clipped-high token keeps −(1 + ε)·A = −1.2 (PPO: 0); −r·A where unclipped (−1.1, 1.5, −0.5);
    # the low clip and the dual clip stay constants
    assert logp.grad[0].tolist() == pytest.approx([-1.2, -1.1, 0.0, 0.0, 1.5, -0.5], abs=1e-6)
    assert out.token_stats["aepo/high_clipped_frac"][0].tolist() == [1, 0, 0, 0, 0, 0]
    assert out.token_stats["clip/high_frac"][0].tolist() == [1, 0, 0, 0, 0, 0]
    assert out.token_stats["clip/low_frac"][0].tolist() == [0, 0, 1, 0, 0, 0]


def test_aepo_clip_matches_the_released_code_and_ce_gppo_gradients():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(6, 20, generator=gen) - 2
    logp0 = old + 0.4 * torch.randn(6, 20, generator=gen)  # ratios well outside [0.8, 1.2]
    adv = torch.randn(6, 20, generator=gen)
    grads = []
    for fn in (
        lambda lp: aepo_clip(lp, old, adv, torch.ones_like(lp)).per_token,
        lambda lp: released_loss(lp, old, adv),
        lambda lp: ce_gppo(lp, old, adv, torch.ones_like(lp), beta_low=0.0, beta_high=1.0, dual_clip=3.0).per_token,
    ):
        lp = logp0.clone().requires_grad_(True)
        loss = fn(lp)
        loss.sum().backward()
        grads.append((loss.detach(), lp.grad))
    (ours, g_ours), (rel, g_rel), (_, g_ce) = grads
    torch.testing.assert_close(ours, rel)  # same values as the released loss
    torch.testing.assert_close(g_ours, g_rel)  # and the same gradients (autograd through its torch.clamp)
    torch.testing.assert_close(g_ours, g_ce)  # = CE-GPPO with β_low = 0, β_high = 1
    # the formula: on the clipped-high tokens the gradient is −(1 + ε_high)·A, where PPO has none
    ratio = torch.exp(logp0 - old)
    high = (ratio > 1.2) & (adv > 0)
    assert high.sum() > 5
    torch.testing.assert_close(g_ours[high], -1.2 * adv[high])
    with pytest.raises(ValueError, match="dual_clip"):
        aepo_clip(logp0, old, adv, torch.ones_like(adv), dual_clip=1.0)


def test_aepo_entropy_aware_advantage_by_hand():
    # one group, rewards (1, 0): GRPO A = ±0.5 / std, Bessel std = √0.5 → ±0.707107
    b = make_batch([1.0, 0.0], [0, 0], lengths=[2, 1], width=2)
    b.extras[TOKEN_ENTROPY] = torch.tensor([[1.0, 3.0], [2.0, 9.9]])  # 9.9 is padding
    adv = aepo(b, alpha=0.2)
    # valid entropies 1, 3, 2: mean 2, Bessel std √((1 + 1 + 0)/2) = 1 → z = (−1, 1 | 0); weights 1 + 0.2·z
    a = 0.5 / math.sqrt(0.5)
    assert adv.tolist() == [
        pytest.approx([a * 0.8, a * 1.2], abs=1e-5),
        pytest.approx([-a * 1.0, 0.0], abs=1e-5),
    ]
    # the entropy term's part |A·0.2·z|: 0.141421, 0.141421, 0 over 3 tokens = 0.094281
    assert b.stats["aepo/entropy_adv_abs_mean"] == pytest.approx(2 * a * 0.2 / 3, abs=1e-5)
    assert aepo.token_entropy  # the trainer computes the entropies for it (Algorithm.advantage_needs_entropy)


def test_aepo_advantage_with_equal_entropies_is_grpo():
    b = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1], lengths=[2, 2, 2, 2], width=2)
    b.extras[TOKEN_ENTROPY] = torch.full((4, 2), 0.7)  # std 0 counts as 1: z = 0
    adv = aepo(b)
    a = 0.5 / math.sqrt(0.5)
    assert adv[:, 0].tolist() == pytest.approx([a, -a, 0.0, 0.0], abs=1e-5)
    assert b.stats["aepo/entropy_adv_abs_mean"] < 1e-7
    with pytest.raises(ValueError, match="alpha"):
        aepo(b, alpha=-1.0)


def test_aepo_trains_two_steps_with_its_mechanism(tiny_cfg):
    # the clip's upper bound made tight so the tiny model's second mini-batch crosses it (ε_high = 0.2 needs ratios
    # the two-step run does not reach); the rest is the config's
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=aepo", "algorithm.loss.eps_high=1e-4"))
    m = result.metrics
    assert result.last_step == 2 and m["train/optimizer_steps"] == 2
    assert math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["aepo/high_clipped_frac"] > 0  # tokens whose clipped gradient the stop-gradient kept
    assert m["aepo/entropy_adv_abs_mean"] > 0  # the entropy term moved the advantages
