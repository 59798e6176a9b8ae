"""RPG's KL-regularised policy gradients (arXiv 2505.17508): the per-token weight on ∇log π, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.losses.kl_regularised import kl_coefficient, rpg


def _grad(p_new, p_old, adv, **kw):
    logp = torch.log(torch.tensor([[p_new]])).requires_grad_(True)
    out = rpg(logp, torch.log(torch.tensor([[p_old]])), torch.tensor([adv]), torch.ones(1, 1), **kw)
    out.per_token.sum().backward()
    return logp.grad.item(), out


def test_kl_coefficients_by_type():
    w = torch.tensor([0.9, 1.0, 1.2])
    b = 0.1
    assert kl_coefficient(w, "fkl", b).tolist() == pytest.approx([0.1] * 3)
    assert kl_coefficient(w, "ufkl", b).tolist() == pytest.approx([0.01, 0.0, -0.02])
    assert kl_coefficient(w, "urkl", b).tolist() == pytest.approx([-b * x * math.log(x) for x in (0.9, 1.0, 1.2)])
    assert kl_coefficient(w, "rkl", b).tolist() == pytest.approx([-b * x * (math.log(x) + 1) for x in (0.9, 1.0, 1.2)])
    with pytest.raises(ValueError, match="kl_type"):
        kl_coefficient(w, "js", b)


def test_rpg_style_clip_weights_inside_and_none_outside():
    # A > 0, w = 1.25 < 1.28: gradient −(A·w + k) with the forward KL's k = β
    g, _ = _grad(0.5, 0.4, 1.0, kl_type="fkl", beta=0.1)
    assert g == pytest.approx(-(1.25 + 0.1))
    g, out = _grad(0.6, 0.4, 1.0, kl_type="fkl", beta=0.1)  # w = 1.5: outside, no gradient
    assert g == 0.0 and out.token_stats["rpg/outside_frac"].item() == 1.0
    g, _ = _grad(0.28, 0.4, -1.0, kl_type="fkl", beta=0.1)  # A < 0, w = 0.7 < 0.8: outside
    assert g == 0.0
    g, _ = _grad(0.36, 0.4, -1.0, kl_type="rkl", beta=0.1)  # A < 0, w = 0.9 inside: −(−0.9 + k_rkl(0.9))
    assert g == pytest.approx(-(-0.9 - 0.1 * 0.9 * (math.log(0.9) + 1)), rel=1e-5)
    g, _ = _grad(4.4, 0.4, -1.0, kl_type="fkl", beta=0.1)  # A < 0, w = 11 >= c = 10: the dual bound, no gradient
    assert g == 0.0


def test_reinforce_style_uses_the_clipped_weight():
    g, _ = _grad(0.6, 0.4, 1.0, kl_type="fkl", beta=0.1, clip=False)  # w = 1.5 → w̄ = 1.28
    assert g == pytest.approx(-(1.28 + 0.1))
    g, _ = _grad(0.4, 0.4, 0.0, kl_type="ufkl", beta=0.1, clip=False)  # on-policy, no advantage: k = 0
    assert g == pytest.approx(0.0)
