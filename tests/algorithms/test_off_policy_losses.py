"""TOPR and M2PO, values and gradients computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.losses.second_moment import m2po, second_moment_mask
from rlexp.algorithms.losses.tapered import topr


def test_topr_weights_hand_computed():
    """Row 0: A = +0.5, sequence log-ratio +0.4 (ratio e^0.4 > 1): weight 1 (no IS on positives).
    Row 1: A = −0.5, sequence log-ratio −0.7 (ratio e^−0.7 < 1): weight e^−0.7 (tapered).
    Row 2: A = −0.5, sequence log-ratio +0.2 (ratio > 1): weight clipped to 1."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.5], [-0.3, -0.2]], requires_grad=True)
    old = torch.tensor([[-1.2, -2.2], [-0.1, -1.2], [-0.4, -0.3]])
    mask = torch.ones(3, 2)
    adv = torch.tensor([0.5, -0.5, -0.5])
    out = topr(logp, old, adv, mask)
    w = torch.tensor([1.0, math.exp(-0.7), 1.0])
    torch.testing.assert_close(out.per_token, -(w * adv)[:, None] * logp, rtol=1e-6, atol=1e-6)
    out.per_token.sum().backward()
    torch.testing.assert_close(logp.grad, -(w * adv)[:, None].expand(3, 2), rtol=1e-6, atol=1e-6)  # sg(weight)
    assert out.token_stats["topr/tapered_frac"][:, 0].tolist() == [0.0, 1.0, 0.0]
    assert out.token_stats["ratio/mean"][1, 0].item() == pytest.approx(math.exp(-0.7), rel=1e-5)


def test_topr_padding_does_not_enter_the_sequence_ratio():
    logp = torch.tensor([[-1.0, -9.0]])
    old = torch.tensor([[-0.5, 0.0]])
    out = topr(logp, old, torch.tensor([-1.0]), torch.tensor([[1.0, 0.0]]))
    assert out.token_stats["ratio/mean"][0, 0].item() == pytest.approx(math.exp(-0.5), rel=1e-5)


def test_topr_refuses_token_level_advantages():
    with pytest.raises(ValueError, match="one advantage per sequence"):
        topr(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))


def test_second_moment_mask_hand_computed():
    """(log r)² = 0.25, 0.01, 0.0, 0.04 (mean 0.075 > τ = 0.04). Masking the largest (0.25) leaves
    mean (0.01 + 0 + 0.04)/3 = 0.0167 ≤ 0.04: exactly one token masked."""
    log_ratio = torch.tensor([[0.5, 0.1], [0.0, -0.2]])
    mask = torch.ones(2, 2)
    keep = second_moment_mask(log_ratio, mask, 0.04)
    assert keep.tolist() == [[False, True], [True, True]]
    assert second_moment_mask(log_ratio, mask, 0.1).all()  # M̂₂ = 0.075 is already under 0.1
    # a padded token is never kept and never counted: its huge log-ratio does not trigger masking
    padded = torch.tensor([[0.1, 5.0]])
    assert second_moment_mask(padded, torch.tensor([[1.0, 0.0]]), 0.04).tolist() == [[True, False]]


def test_second_moment_mask_needs_several_tokens_hand_computed():
    """(log r)² = 0.36, 0.16, 0.09, 0.01 (mean 0.155). Mask 0.36: mean 0.0867 > 0.05; mask 0.16 too:
    mean 0.05 ≤ 0.05: two tokens masked."""
    log_ratio = torch.tensor([[0.6, -0.4, 0.3, 0.1]])
    keep = second_moment_mask(log_ratio, torch.ones(1, 4), 0.05)
    assert keep.tolist() == [[False, False, True, True]]


def test_m2po_is_the_unclipped_surrogate_on_the_kept_tokens():
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    old = logp.detach() - torch.tensor([[0.5, 0.1], [0.0, -0.2]])
    adv = torch.tensor([1.0, -2.0])
    out = m2po(logp, old, adv, torch.ones(2, 2), m2_threshold=0.04)
    r = torch.exp(torch.tensor([[0.5, 0.1], [0.0, -0.2]]))
    keep = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(out.per_token, -r * adv[:, None] * keep, rtol=1e-6, atol=1e-6)
    out.per_token.sum().backward()
    torch.testing.assert_close(logp.grad, -r * adv[:, None] * keep, rtol=1e-6, atol=1e-6)  # d r / d log π = r
    assert out.token_stats["m2po/masked_frac"].sum().item() == 1.0


def test_bapo_bound_search_hand_computed():
    """A = +1, −1, −1, −1 with r = 1.5, 0.62, 0.75, 1.0. Start [0.6, 1.2]: the positive token is clipped
    (r > 1.2), the three negatives pass: share 0 < 0.5. Raise c_low 0.65 (drops r = 0.62: share 0), 0.70,
    0.75 (r = 0.75 ≥ 0.75 still passes), 0.80 (drops it: only r = 1.0 left, share 0) ... up to 0.9: still 0
    (the positive is clipped). Then c_high 1.25, ..., 1.5: the positive passes, share 1.5 / (1.5 + 1.0) = 0.6."""
    from rlexp.algorithms.losses.adaptive_clip import adapt_bounds, balance

    r = torch.tensor([[1.5, 0.62, 0.75, 1.0]])
    a = torch.tensor([[1.0, -1.0, -1.0, -1.0]])
    m = torch.ones(1, 4)
    assert balance(r, a, m, 0.6, 1.2) == 0.0
    low, high, share = adapt_bounds(r, a, m, 0.5, (0.6, 0.9, 0.05), (1.2, 3.0, 0.05))
    assert low == pytest.approx(0.9) and high == pytest.approx(1.5) and share == pytest.approx(0.6)
    # already balanced: the bounds stay where they start
    assert adapt_bounds(r, -a, m, 0.5, (0.6, 0.9, 0.05), (1.2, 3.0, 0.05))[:2] == (0.6, 1.2)


def test_bapo_loss_is_ppo_clip_at_the_searched_bounds():
    from rlexp.algorithms.losses.adaptive_clip import bapo
    from rlexp.algorithms.losses.clip import ppo_clip

    logp = torch.log(torch.tensor([[1.5, 0.62, 0.75, 1.0]]))
    old = torch.zeros(1, 4)
    tok_adv = torch.tensor([[1.0, -1.0, -1.0, -1.0]])
    out = bapo(logp, old, tok_adv, torch.ones(1, 4))
    ref = ppo_clip(logp, old, tok_adv, torch.ones(1, 4), eps_low=1 - 0.9, eps_high=1.5 - 1, dual_clip=3.0)
    torch.testing.assert_close(out.per_token, ref.per_token)
    assert out.token_stats["bapo/clip_high"][0, 0].item() == pytest.approx(1.5)


def test_opmd_is_reinforce_over_one_plus_tau():
    from rlexp.algorithms.losses.reinforce import opmd

    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    out = opmd(logp, logp.detach() - 0.5, torch.tensor([0.8]), torch.ones(1, 2), tau=1.0)
    torch.testing.assert_close(out.per_token, -0.8 * logp / 2)
    out.per_token.sum().backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 2), -0.4))  # no importance ratio, whatever old_logp is
