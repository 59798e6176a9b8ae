"""Issue 20 §3 seed ratio methods — CE-GPPO, ASPO, GBPO, StableReinforce: (a) values and gradients worked by hand,
(b) where the gradient differs from GRPO's (ppo_clip) off-policy and where it coincides, (d) parity with each
method's released formula, written independently here (neither verl nor TRL ships these four losses)."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.filtered import sigma_filter
from rlexp.algorithms.advantages.filtered import stable_reinforce as stable_reinforce_adv
from rlexp.algorithms.advantages.median import gbpo as gbpo_adv
from rlexp.algorithms.advantages.median import group_median
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.asymmetric import aspo, high_entropy_tokens
from rlexp.algorithms.losses.bounded_ratio import gbpo, target_ratio
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.gradient_preserving import ce_gppo
from rlexp.algorithms.losses.pre_clip import stable_reinforce
from tests.algorithms.batches import make_batch


def _grad(loss_fn, log_ratio, adv, **kw):
    """(per-token loss, d loss / d logp) at logp = −1 + log_ratio, old = −1."""
    logp = (torch.full_like(log_ratio, -1.0) + log_ratio).requires_grad_(True)
    old = torch.full_like(log_ratio, -1.0)
    out = loss_fn(logp, old, adv, torch.ones_like(log_ratio), **kw)
    out.per_token.sum().backward()
    return out, logp.grad


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------------------------------- CE-GPPO

LR = torch.tensor([[-0.5, 0.5, 0.1, -0.1]])  # r = 0.6065, 1.6487, 1.1052, 0.9048
ADV = torch.tensor([[-1.0, 1.0, 1.0, -1.0]])


def test_ce_gppo_hand_computed():
    """ε = 0.2, β_low = 0.5, β_high = 1. t0: A = −1, r < 0.8: value −0.5·0.8·A = 0.4, gradient 0.4 (PPO: 0).
    t1: A = +1, r > 1.2: value −1.2, gradient −1.2 (PPO: 0). t2, t3 inside the clip: PPO's −r·A, gradient −r·A."""
    out, g = _grad(ce_gppo, LR, ADV, eps_low=0.2, eps_high=0.2, beta_low=0.5, beta_high=1.0)
    r = torch.exp(LR)
    _close(out.per_token, [[0.4, -1.2, -r[0, 2].item(), r[0, 3].item()]])
    _close(g, [[0.4, -1.2, -r[0, 2].item(), r[0, 3].item()]])
    assert out.token_stats["ce_gppo/preserved_frac"].tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert out.token_stats["clip/region_frac"].tolist() == [[1.0, 1.0, 0.0, 0.0]]


def test_ce_gppo_dual_clip_caps_negative_tokens():
    """A = −1, r = e^2.5 = 12.18 > c = 10: loss min(12.18, 10) = 10, no gradient (Dual-Clip PPO)."""
    out, g = _grad(ce_gppo, torch.tensor([[2.5]]), torch.tensor([[-1.0]]), dual_clip=10.0)
    _close(out.per_token, [[10.0]])
    _close(g, [[0.0]])


def test_ce_gppo_differs_from_grpo_off_policy_and_coincides_inside_the_clip():
    _, g = _grad(ce_gppo, LR, ADV, beta_low=0.5, beta_high=1.0)
    _, g_ppo = _grad(ppo_clip, LR, ADV)
    assert (g[0, :2] - g_ppo[0, :2]).abs().min() > 0.3  # the clipped tokens keep a gradient
    _close(g[0, 2:], g_ppo[0, 2:])  # inside the clip interval: PPO's gradient exactly
    # on-policy (r = 1 everywhere) value and gradient are GRPO's
    zero = torch.zeros(1, 4)
    out, g = _grad(ce_gppo, zero, ADV)
    out_ppo, g_ppo = _grad(ppo_clip, zero, ADV)
    _close(out.per_token, out_ppo.per_token.detach())
    _close(g, g_ppo)
    # β = 0: no gradient from the clipped tokens, i.e. PPO's gradient everywhere
    _, g0 = _grad(ce_gppo, LR, ADV, beta_low=0.0, beta_high=0.0)
    _, g_ppo = _grad(ppo_clip, LR, ADV)
    _close(g0, g_ppo)


def _ce_gppo_release(old_log_prob, log_prob, advantages, eps_low, eps_high, c, beta1, beta2):
    """The released loss (Kwai-Klear/CE-GPPO README, compute_gppo_loss_general_beta), written out here."""
    ratio = torch.exp(log_prob - old_log_prob)
    rd = ratio.detach()
    low_mask = (ratio < (1 - eps_low)) & (advantages < 0)
    high_mask = (ratio > (1 + eps_high)) & (advantages > 0)
    other = ~(low_mask | high_mask)
    l1 = torch.zeros_like(advantages)
    l1[low_mask] = -beta1 * (1 - eps_low) / rd[low_mask] * ratio[low_mask] * advantages[low_mask]
    l1[high_mask] = -beta2 * (1 + eps_high) / rd[high_mask] * ratio[high_mask] * advantages[high_mask]
    l1[other] = -ratio[other] * advantages[other]
    l3 = -advantages * c
    return torch.where(advantages < 0, torch.min(l3, l1), l1)


def test_ce_gppo_matches_the_released_formula():
    torch.manual_seed(0)
    lr = torch.randn(4, 7) * 0.6
    adv = torch.randn(4, 7)
    logp = (torch.randn(4, 7) - 2).requires_grad_(True)
    logp2 = logp.detach().clone().requires_grad_(True)
    old = logp.detach() - lr
    ours = ce_gppo(logp, old, adv, torch.ones(4, 7), 0.2, 0.28, 0.75, 1.0, dual_clip=3.0).per_token
    ref = _ce_gppo_release(old, logp2, adv, 0.2, 0.28, 3.0, 0.75, 1.0)
    _close(ours, ref.detach())
    ours.sum().backward()
    ref.sum().backward()
    _close(logp.grad, logp2.grad)


# -------------------------------------------------------------------------------------------------------- ASPO

ALR = torch.tensor([[-0.5, -1.5, 0.5, -0.5, 0.5, 1.5]])  # r = 0.607, 0.223, 1.649, 0.607, 1.649, 4.482
AADV = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, -1.0]])


def test_aspo_hand_computed():
    """ε = 0.2, c = 3. Positives: t0 r = e^−0.5 inside the clip: weight 1/r = e^0.5 (value −1/r = −e^0.5);
    t1 1/r = e^1.5 = 4.48 > 3: soft dual clip, weight 3 (value −3·log π); t2 r > 1.2: clipped, value −1/1.2, no
    gradient. Negatives: t3 r < 0.8: clipped, value 0.8, no gradient; t4 inside: weight r = e^0.5; t5 r = e^1.5 > 3:
    weight 3 (value 3·log π)."""
    out, g = _grad(aspo, ALR, AADV, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    e5, e15 = math.exp(0.5), math.exp(1.5)
    logp = -1.0 + ALR
    _close(out.per_token, [[-e5, -3.0 * logp[0, 1].item(), -1 / 1.2, 0.8, e5, 3.0 * logp[0, 5].item()]])
    _close(g, [[-e5, -3.0, 0.0, 0.0, e5, 3.0]])
    _close(out.token_stats["aspo/weight_mean"], [[e5, 3.0, 0.0, 0.0, e5, 3.0]])
    assert out.token_stats["aspo/dual_clip_pos_frac"].tolist() == [[0, 1, 0, 0, 0, 0]]
    assert out.token_stats["aspo/dual_clip_neg_frac"].tolist() == [[0, 0, 0, 0, 0, 1]]
    assert out.token_stats["clip/high_frac"].tolist() == [[0, 0, 1, 0, 0, 0]]
    assert out.token_stats["clip/low_frac"].tolist() == [[0, 0, 0, 1, 0, 0]]
    assert e15 > 3


def test_aspo_differs_from_grpo_off_policy_and_coincides_on_policy():
    """Off-policy the positive tokens' weight is 1/r (GRPO: r) and the dual-clipped negative keeps weight 3 (GRPO: r);
    GRPO's gradient exactly on the clipped tokens and the negatives inside the clip. On-policy r = 1 = 1/r: GRPO's
    value and gradient everywhere (the paper's flip changes nothing until the policy moves)."""
    _, g = _grad(aspo, ALR, AADV)
    _, g_ppo = _grad(ppo_clip, ALR, AADV)
    for t in (0, 1, 5):
        assert abs(g[0, t] - g_ppo[0, t]) > 0.5
    _close(g[0, [2, 3, 4]], g_ppo[0, [2, 3, 4]])
    zero = torch.zeros(1, 6)
    out, g = _grad(aspo, zero, AADV)
    out_ppo, g_ppo = _grad(ppo_clip, zero, AADV)
    _close(out.per_token, out_ppo.per_token.detach())
    _close(g, g_ppo)


def test_aspo_entropy_dependent_bounds_hand_computed():
    """Entropies 0.1, 0.2, 0.3, 0.4, 5.0: the 0.8 quantile is 0.4 + 0.2·(5.0 − 0.4) = 1.32, so only the last token is
    high-entropy and takes the wide bound 1.4. Every token has A = +1 and r = 1.3: clipped at 1.2 (no gradient) except
    the last, inside 1.4 (weight 1/1.3)."""
    ent = torch.tensor([[0.1, 0.2, 0.3, 0.4, 5.0]])
    assert high_entropy_tokens(ent, torch.ones(1, 5), 0.8).tolist() == [[False, False, False, False, True]]
    lr = torch.full((1, 5), math.log(1.3))
    out, g = _grad(aspo, lr, torch.ones(1, 5), high_entropy_eps_low=0.4, high_entropy_eps_high=0.4, entropy=ent)
    _close(g, [[0.0, 0.0, 0.0, 0.0, -1 / 1.3]])
    with pytest.raises(ValueError, match="entropies"):
        aspo(lr, lr, torch.ones(1, 5), torch.ones(1, 5), high_entropy_eps_high=0.4)
    # a padded token's entropy is not counted: the quantile of (0.1, 0.2) is 0.18, token 1 is above it
    assert high_entropy_tokens(torch.tensor([[0.1, 0.2, 9.0]]), torch.tensor([[1, 1, 0]]), 0.8).tolist() == [
        [False, True, False]
    ]


def _aspo_release(old_log_prob, log_prob, advantages, entropy_low_mask, lo_n, hi_n, lo_w, hi_w, c_neg, c_pos):
    """The released loss (wizard-III/Archer2.0 compute_policy_loss_archer, without its ±20 clamp), written out here;
    ``entropy_low_mask``: the tokens at or under their response's entropy quantile (narrow bounds lo_n/hi_n)."""
    ratio = torch.exp(log_prob - old_log_prob)
    neg_clip = torch.where(entropy_low_mask, torch.clamp(ratio, min=1 - lo_n), torch.clamp(ratio, min=1 - lo_w))
    pos_clip = torch.where(entropy_low_mask, torch.clamp(ratio, max=1 + hi_n), torch.clamp(ratio, max=1 + hi_w))
    neg_loss = -advantages * neg_clip
    pos_loss = -advantages * (pos_clip / pos_clip.detach()) / pos_clip.detach()
    neg_dual = torch.clamp(neg_clip, max=c_neg)
    neg_mask = neg_clip > neg_dual
    neg_loss = torch.where(neg_mask, -advantages * neg_dual.detach() * log_prob, neg_loss)
    pos_dual = torch.clamp(1 / pos_clip, max=c_pos)
    pos_mask = (1 / pos_clip) > pos_dual
    pos_loss = torch.where(pos_mask, -advantages * pos_dual.detach() * log_prob, pos_loss)
    return torch.where(advantages < 0, neg_loss, pos_loss)


def test_aspo_matches_the_released_formula():
    torch.manual_seed(1)
    shape = (3, 9)
    lr = torch.randn(shape) * 0.9
    adv = torch.randn(shape)
    ent = torch.rand(shape) * 3
    logp = (torch.randn(shape) - 2).requires_grad_(True)
    logp2 = logp.detach().clone().requires_grad_(True)
    old = logp.detach() - lr
    mask = torch.ones(shape)
    ours = aspo(logp, old, adv, mask, 0.2, 0.2, 3.0, 3.0, 0.4, 0.4, 0.8, entropy=ent).per_token
    low_entropy = ~high_entropy_tokens(ent, mask, 0.8)
    ref = _aspo_release(old, logp2, adv, low_entropy, 0.2, 0.2, 0.4, 0.4, 3.0, 3.0)
    _close(ours, ref.detach())
    ours.sum().backward()
    ref.sum().backward()
    _close(logp.grad, logp2.grad)


# -------------------------------------------------------------------------------------------------------- GBPO


def test_gbpo_advantage_and_target_hand_computed():
    """Group 0 rewards (1, 0, 0, 0): mean 0.25, std 0.5, median 0 → advantage (1.5, −0.5, −0.5, −0.5), target
    (r − 0)/0.5 = (2, 0, 0, 0). Group 1 (1, 1, 0): mean 2/3, std √(1/3), median 1 → target (0, 0, −√3).
    Group 2 is a singleton: 0 and 0."""
    batch = make_batch([1, 0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1, 2])
    adv = gbpo_adv(batch, eps=0.0, temperature=1.0)
    s = math.sqrt(1 / 3)
    _close(adv, [1.5, -0.5, -0.5, -0.5, (1 / 3) / s, (1 / 3) / s, -(2 / 3) / s, 0.0])
    _close(batch.extras["gbpo_target"], [2.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1 / s, 0.0])
    assert batch.stats["gbpo/above_median_frac"] == pytest.approx(1 / 7)
    assert batch.stats["gbpo/below_median_frac"] == pytest.approx(1 / 7)
    _close(group_median(torch.tensor([3.0, 1.0, 2.0, 4.0]), torch.tensor([0, 0, 1, 1])), [2.0, 2.0, 3.0, 3.0])
    # temperature divides the target only
    batch2 = make_batch([1, 0, 0, 0], [0, 0, 0, 0])
    gbpo_adv(batch2, eps=0.0, temperature=0.5)
    _close(batch2.extras["gbpo_target"], [4.0, 0.0, 0.0, 0.0])


def test_gbpo_loss_hand_computed():
    """ε = 0.3. Row 0: A = +1, target ≫ 0 → r* = 1.3, r = e^0.1: loss 1.3 − 1.1052, gradient −1·r (up, towards 1.3).
    Row 1: A = −0.5, target ≪ 0 → r* = 0.7, r = e^−0.5 = 0.6065: loss 0.5·(0.7 − 0.6065), gradient −0.5·r (up, back
    to 0.7). Row 2: A = +2, target 0 → r* = 1, r = e^0.2: loss 2·(r − 1), gradient +2·r (down, towards 1)."""
    _close(target_ratio(torch.tensor([1e4, 0.0, -1e4]), 0.3, 0.3), [1.3, 1.0, 0.7])
    lr = torch.tensor([[0.1], [-0.5], [0.2]])
    adv = torch.tensor([1.0, -0.5, 2.0])
    tgt = torch.tensor([1e4, -1e4, 0.0])
    out, g = _grad(gbpo, lr, adv, gbpo_target=tgt, eps_low=0.3, eps_high=0.3)
    r = torch.exp(lr)[:, 0]
    _close(out.per_token[:, 0], [1.3 - r[0], 0.5 * (0.7 - r[1]), 2 * (r[2] - 1)])
    _close(g[:, 0], [-r[0], -0.5 * r[1], 2 * r[2]])
    _close(out.token_stats["gbpo/target_ratio"][:, 0], [1.3, 0.7, 1.0])
    assert out.token_stats["clip/low_frac"][:, 0].tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="gbpo_target"):
        gbpo(lr, lr, adv, torch.ones(3, 1))


def test_gbpo_differs_from_grpo_off_policy_and_coincides_on_the_improving_side():
    """Row 0 of the hand case (above the median, A > 0, r < r*) is GRPO's gradient with ε = 0.3 exactly (BRRL: PPO's
    loss drives the ratio towards the same optimum); rows 1 and 2, which PPO clips (no gradient), are pulled back to
    the bound. On-policy, a completion above (below) the median with A > 0 (< 0) has GRPO's gradient −A."""
    lr = torch.tensor([[0.1], [-0.5], [0.2]])
    adv = torch.tensor([1.0, -0.5, 2.0])
    _, g = _grad(gbpo, lr, adv, gbpo_target=torch.tensor([1e4, -1e4, 0.0]))
    _, g_ppo = _grad(ppo_clip, lr, adv, eps_low=0.3, eps_high=0.3)
    _close(g[0], g_ppo[0])
    _, g_ppo2 = _grad(ppo_clip, lr, adv, eps_low=0.2, eps_high=0.2)
    assert g_ppo2[1, 0] == 0 and g_ppo2[2, 0] == 0 and g[1, 0] != 0 and g[2, 0] != 0
    zero = torch.zeros(2, 3)
    a = torch.tensor([1.5, -0.5])
    _, g = _grad(gbpo, zero, a, gbpo_target=torch.tensor([2e4, -3e4]))
    _, g_ppo = _grad(ppo_clip, zero, a)
    _close(g, g_ppo)


def test_gbpo_matches_the_released_formula():
    """bounded-ratio-rl compute_policy_loss_gbpo: |(r − (1 − ε_l + (ε_h + ε_l)·σ(target)))·A| (no ±20 clamp)."""
    torch.manual_seed(2)
    lr = torch.randn(4, 5) * 0.4
    adv = torch.randn(4)
    tgt = torch.randn(4) * 3
    logp = (torch.randn(4, 5) - 1).requires_grad_(True)
    logp2 = logp.detach().clone().requires_grad_(True)
    old = logp.detach() - lr
    ours = gbpo(logp, old, adv, torch.ones(4, 5), gbpo_target=tgt, eps_low=0.2, eps_high=0.3).per_token
    ratio = torch.exp(logp2 - old)
    ref = torch.abs((ratio - (1.0 - 0.2 + (0.3 + 0.2) * torch.sigmoid(tgt[:, None]))) * adv[:, None])
    _close(ours, ref.detach())
    ours.sum().backward()
    ref.sum().backward()
    _close(logp.grad, logp2.grad)


def test_algorithm_hands_the_loss_its_batch_extras_and_entropies():
    algo = Algorithm(name="t", advantage=gbpo_adv, loss=gbpo)
    assert algo.loss_batch_extras == ("gbpo_target",)
    lp = torch.zeros(1, 2)
    out = algo.token_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), extras={"gbpo_target": torch.tensor([1e4])})
    _close(out.token_stats["gbpo/target_ratio"], [[1.3, 1.3]])
    with pytest.raises(ValueError, match="gbpo_target"):
        algo.token_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2))
    from functools import partial

    algo = Algorithm(name="t", advantage=gbpo_adv, loss=partial(aspo, high_entropy_eps_high=0.4))
    ent = torch.tensor([[0.1, 5.0]])
    lr = torch.full((1, 2), math.log(1.3))
    out = algo.token_loss(lr, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), ent)
    assert out.token_stats["clip/high_frac"].tolist() == [[1.0, 0.0]]  # the high-entropy token has the wide bound


# --------------------------------------------------------------------------------------------- StableReinforce


def test_stable_reinforce_pre_clip_hand_computed():
    """A = −1 and log-ratio 8 (r = 2981): PPO leaves it unclipped (loss 2981, gradient 2981); the Pre-CLIP caps
    r at 1e3 (loss 1000) with no gradient. A token inside the bounds is ppo_clip's in value and gradient."""
    lr = torch.tensor([[8.0, 0.1, -0.3]])
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    out, g = _grad(stable_reinforce, lr, adv)
    out_ppo, g_ppo = _grad(ppo_clip, lr, adv)
    _close(out.per_token[0, 0], 1000.0, tol=1e-3)
    assert g[0, 0] == 0
    _close(out_ppo.per_token[0, 0].detach(), math.exp(8.0), tol=1e-3)
    _close(g_ppo[0, 0], math.exp(8.0), tol=1e-3)
    _close(out.per_token[0, 1:], out_ppo.per_token[0, 1:].detach())
    _close(g[0, 1:], g_ppo[0, 1:])
    assert out.token_stats["stable_reinforce/pre_clip_frac"].tolist() == [[1.0, 0.0, 0.0]]
    # below ratio_min = 1e-3 (log-ratio −8), A > 0: PPO's −r·A is tiny anyway; the clamp stops its gradient
    out, g = _grad(stable_reinforce, torch.tensor([[-8.0]]), torch.tensor([[1.0]]))
    _close(out.per_token, [[-1e-3]])
    assert g[0, 0] == 0


def test_stable_reinforce_matches_the_released_formula():
    """yfzhang114/r1_reward PolicyLoss: ratio = exp(clamp(Δ, log 1e-3, log 1e3)), −min(r·A, clip(r, 1 ± ε)·A)."""
    torch.manual_seed(3)
    lr = torch.randn(3, 6) * 4
    adv = torch.randn(3, 6)
    logp = (torch.randn(3, 6) - 1).requires_grad_(True)
    logp2 = logp.detach().clone().requires_grad_(True)
    old = logp.detach() - lr
    ours = stable_reinforce(logp, old, adv, torch.ones(3, 6)).per_token
    ratio = torch.exp(torch.clamp(logp2 - old, max=math.log(1e3), min=math.log(1e-3)))
    ref = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    _close(ours, ref.detach(), tol=1e-4)
    ours.sum().backward()
    ref.sum().backward()
    _close(logp.grad, logp2.grad, tol=1e-4)


def test_sigma_filter_hand_computed():
    adv = torch.tensor([[0.5, -3.5], [3.0, 4.0]])
    filtered, dropped = sigma_filter(adv, torch.tensor([[1, 1], [1, 0]]), 3.0)
    _close(filtered, [[0.5, 0.0], [3.0, 4.0]])  # exactly 3 is kept; the padded 4.0 is not counted
    assert dropped.tolist() == [[False, True], [False, False]]


def test_stable_reinforce_advantage_filters_the_rare_reward():
    """Eleven one-token completions, one rewarded: mean 1/11, Bessel variance ((10/11)² + 10·(1/11)²)/10 = 1/11, so
    REINFORCE++ whitening gives the rewarded one (10/11)·√11 = 10/√11 = 3.015 > 3 — the filter zeroes it — and the ten
    others −(1/11)·√11 = −0.3015, which stay."""
    batch = make_batch([1.0] + [0.0] * 10, list(range(11)), lengths=[1] * 11)
    plain = stable_reinforce_adv(batch, sigma=1e9)
    assert plain[0, 0].item() == pytest.approx(10 / math.sqrt(11), rel=1e-4)
    _close(plain[1:, 0], torch.full((10,), -1 / math.sqrt(11)))
    adv = stable_reinforce_adv(batch, sigma=3.0)
    assert adv[0, 0].item() == 0.0
    _close(adv[1:, 0], plain[1:, 0])
    assert batch.stats["stable_reinforce/filtered_frac"] == pytest.approx(1 / 11)
