"""TROLL's trust-region projection (rlexp/algorithms/losses/trust_region.py): the sparse support, the bucketed KL and
interpolation by hand, the projection's bound and its implicit gradient against finite differences, the loss equal
to GRPO's policy gradient on-policy and different once the constraint binds, and the method on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.trust_region import (
    TrustRegionProjection,
    interpolate,
    kl,
    project,
    solve_eta,
    sparse_support,
    with_rest,
)
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

L = math.log


def test_sparse_support_cuts_by_mass_and_keeps_the_sampled_token():
    top_idx = torch.tensor([[[7, 3, 9, 4]]])
    top_lp = torch.tensor([[[L(0.1), L(0.6), L(0.299), L(0.001)]]])
    # mass 0.6, 0.899, 0.999, 1.0: with δ = 0.01 the first three reach 1 − δ; token 4 (the last) is sampled
    idx, old, col = sparse_support(top_idx, top_lp, torch.tensor([[4]]), torch.tensor([[L(0.001)]]), delta=0.01)
    assert idx[0, 0].tolist() == [3, 9, 7, 4, 4]
    assert old[0, 0, :4].tolist() == pytest.approx([L(0.6), L(0.299), L(0.1), L(0.001)], rel=1e-5)
    assert old[0, 0, 4] == float("-inf"), "the sampled token is already in the support: no second column"
    assert col.tolist() == [[3]]
    idx, old, col = sparse_support(top_idx, top_lp, torch.tensor([[5]]), torch.tensor([[L(1e-4)]]), delta=0.01)
    assert old[0, 0].tolist()[3] == float("-inf"), "past the mass cut and not sampled: left out"
    assert idx[0, 0, 4] == 5 and old[0, 0, 4] == pytest.approx(L(1e-4)) and col.tolist() == [[4]]


def test_rest_bucket_kl_and_interpolation_by_hand():
    p = with_rest(torch.tensor([L(0.5), L(0.3), 0.0]), torch.tensor([True, True, False]))
    assert p.exp().tolist() == pytest.approx([0.5, 0.3, 0.0, 0.2])
    q = with_rest(torch.tensor([L(0.25), L(0.25), 0.0]), torch.tensor([True, True, False]))
    expected = 0.5 * L(0.5 / 0.25) + 0.3 * L(0.3 / 0.25) + 0.2 * L(0.2 / 0.5)
    assert float(kl(p, q)) == pytest.approx(expected, rel=1e-5)
    # η = 1: the normalised geometric mean √(p·q)
    mid = interpolate(p, q, torch.tensor(1.0)).exp()
    g = torch.tensor([math.sqrt(0.5 * 0.25), math.sqrt(0.3 * 0.25), 0.0, math.sqrt(0.2 * 0.5)])
    assert mid.tolist() == pytest.approx((g / g.sum()).tolist(), rel=1e-5)


def test_projection_is_the_identity_inside_the_ball_and_meets_the_bound_outside():
    torch.manual_seed(0)
    old = torch.log_softmax(torch.randn(6, 5, dtype=torch.float64), -1)
    near = torch.log_softmax(old + 0.01 * torch.randn(6, 5, dtype=torch.float64), -1)
    proj, eta = project(near, old, bound=0.05)
    assert (eta == 0).all() and torch.allclose(proj, near)
    far = torch.log_softmax(torch.randn(6, 5, dtype=torch.float64) * 3, -1)
    proj, eta = project(far, old, bound=0.05)
    assert (eta > 0).all()
    assert kl(proj, old).tolist() == pytest.approx([0.05] * 6, rel=1e-6)
    # the closed form: log π ∝ (log π̃ + η log π_old) / (η + 1)
    by_hand = torch.log_softmax((far + eta[:, None] * old) / (eta[:, None] + 1), -1)
    assert torch.allclose(proj, by_hand)
    assert (solve_eta(far, old, 0.05) == eta).all()


def test_projection_gradient_flows_through_eta_as_finite_differences_say():
    torch.manual_seed(1)
    old = torch.log_softmax(torch.randn(3, 5, dtype=torch.float64), -1)
    cur = torch.log_softmax(torch.randn(3, 5, dtype=torch.float64) * 2, -1).requires_grad_(True)
    weights = torch.randn(3, 5, dtype=torch.float64)
    (project(cur, old, 0.05, steps=60)[0] * weights).sum().backward()
    base = cur.detach()
    numeric = torch.zeros_like(base)
    for i in range(3):
        for j in range(5):
            d = torch.zeros_like(base)
            d[i, j] = 1e-5
            plus = (project(base + d, old, 0.05, steps=60)[0] * weights).sum()  # η* to 1e-17: FD noise-free
            minus = (project(base - d, old, 0.05, steps=60)[0] * weights).sum()
            numeric[i, j] = (plus - minus) / 2e-5
    assert torch.allclose(cur.grad, numeric, atol=1e-5)


def _loss_inputs(cur_logits, old_logits, token):
    """One position over a 5-token vocabulary: the support is its first 4 tokens (the 5th is the rest bucket), the
    sampled ``token`` among them; the current log-probs come from ``cur_logits`` (a leaf with gradient)."""
    logits = cur_logits.clone().requires_grad_(True)
    cur = torch.log_softmax(logits, -1)[:4].reshape(1, 1, 4)
    old = torch.log_softmax(old_logits, -1)[:4].reshape(1, 1, 4)
    return logits, cur, old, torch.tensor([[token]]), old[..., token]


def _clip_grad(logits_value, old_tok, token, adv, mask, **kw):
    logits = logits_value.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)[token].reshape(1, 1)
    ppo_clip(logp, old_tok, adv, mask, **kw).per_token.sum().backward()
    return logits.grad


def test_loss_is_grpos_policy_gradient_on_policy():
    values = torch.tensor([1.0, 0.5, -1.0, 0.0, -0.5])
    logits, cur, old, pos, old_tok = _loss_inputs(values, values, 1)
    adv, mask = torch.tensor([0.7]), torch.ones(1, 1)
    out = TrustRegionProjection(kl_bound=0.05)(cur[..., 1], old_tok, adv, mask, old, pos, cur)
    assert out.per_token.item() == pytest.approx(-0.7, rel=1e-6)
    out.per_token.sum().backward()
    # the gradient on the logits is GRPO's −A·(onehot − π): the regression term's vanishes at π = π̃
    assert torch.allclose(logits.grad, _clip_grad(values, old_tok, 1, adv, mask), atol=1e-6)
    assert out.token_stats["troll/projected_frac"].item() == 0.0


def test_loss_differs_from_the_clip_off_policy_where_the_bound_binds():
    values = torch.tensor([3.0, 0.0, -1.0, 0.0, 0.0])
    logits, cur, old, pos, old_tok = _loss_inputs(values, torch.zeros(5), 0)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 1)
    out = TrustRegionProjection(kl_bound=0.05)(cur[..., 0], old_tok, adv, mask, old, pos, cur)
    assert out.token_stats["troll/projected_frac"].item() == 1.0
    assert out.token_stats["troll/kl_projected"].item() == pytest.approx(0.05, rel=1e-4)
    assert out.token_stats["troll/regression"].item() > 0
    ratio = out.token_stats["ratio/mean"].item()
    unprojected = math.exp(float(cur[0, 0, 0].detach() - old_tok[0, 0]))
    assert 1.0 < ratio < unprojected, "the projection pulls the ratio toward 1"
    out.per_token.sum().backward()
    clip = _clip_grad(values, old_tok, 0, adv, mask, eps_low=0.2, eps_high=0.2)
    assert clip.abs().sum() == 0.0, "the clip: no gradient past 1 + ε"
    assert logits.grad.abs().sum() > 1e-3, "TROLL still moves the policy, toward the projection"


TROLL_FAST = [
    *VARYING,
    "algorithm=troll",
    "trainer.autocast=off",
    "trainer.max_new_tokens=6",
    "trainer.num_generations=2",
]


def test_troll_runs_two_steps_off_policy_and_logs_its_mechanism(tiny_cfg):
    m = run(tiny_cfg(*TROLL_FAST)).metrics
    assert m["train/optimizer_steps"] == 2.0  # the config's 4 mini-batches, capped at the tiny step's 2 groups
    assert m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0
    for name in ("troll/projected_frac", "troll/kl_to_old", "troll/kl_projected", "troll/eta", "troll/support"):
        assert name in m and math.isfinite(m[name]), name
    assert m["troll/support"] > 1


def test_troll_projects_when_the_bound_is_tight(tiny_cfg):
    m = run(tiny_cfg(*TROLL_FAST, "algorithm.loss.kl_bound=1e-6", "optimizer.lr=1e-3")).metrics
    assert m["troll/projected_frac"] > 0
    assert m["troll/kl_projected"] <= 2e-6 < m["troll/kl_to_old"], "fp32 KLs: the bound holds to ~1e-7"
