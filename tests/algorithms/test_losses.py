"""Policy losses on hand-computed examples: values and gradients w.r.t. the current log-probs."""

import math

import torch

from rlexp.algorithms.losses.clip import cispo, ppo_clip
from rlexp.algorithms.losses.covariance import clip_cov, kl_cov
from rlexp.algorithms.losses.reinforce import reinforce
from rlexp.algorithms.losses.sequence import gmpo, gspo
from rlexp.algorithms.losses.soft_gates import sapo


def t(x, grad=False):
    return torch.tensor(x, dtype=torch.float32, requires_grad=grad)


def close(x, expected, tol=1e-5):
    torch.testing.assert_close(x.detach().float(), torch.tensor(expected, dtype=torch.float32), atol=tol, rtol=0)


def grad_of(out, logp):
    (g,) = torch.autograd.grad(out.per_token.sum(), logp)
    return g


def test_reinforce_is_minus_advantage_times_logprob():
    logp = t([[-1.0, -2.0]], grad=True)
    out = reinforce(logp, logp.detach(), t([0.5]), t([[1, 1]]))
    close(out.per_token, [[0.5, 1.0]])
    close(grad_of(out, logp), [[-0.5, -0.5]])


def test_cispo_clipped_stop_gradient_weight():
    logp, old = t([[-1.0, -1.0]], grad=True), t([[-1.2, -0.5]])
    adv, mask = t([2.0]), t([[1, 1]])
    out = cispo(logp, old, adv, mask, eps_low=0.2, eps_high=0.1)
    # ratios e^0.2 = 1.2214 → capped at 1.1; e^-0.5 = 0.6065 → floored at 0.8
    close(out.per_token, [[-1.1 * 2 * -1.0, -0.8 * 2 * -1.0]])
    close(grad_of(out, logp), [[-1.1 * 2, -0.8 * 2]])  # the weight carries no gradient
    unbounded = cispo(logp, old, adv, mask, eps_low=None, eps_high=4.0)
    close(unbounded.per_token, [[math.exp(0.2) * 2, math.exp(-0.5) * 2]])
    assert unbounded.token_stats["clip/high_frac"].sum() == 0


def test_sapo_gate_value_and_unit_slope_on_policy():
    logp = t([[-1.0, -1.0]], grad=True)
    pos = sapo(logp, logp.detach(), t([1.0]), t([[1, 1]]), tau_pos=1.0, tau_neg=1.05)
    close(pos.per_token, [[-2.0, -2.0]])  # f(1) = 2/τ
    close(grad_of(pos, logp), [[-1.0, -1.0]])  # f'(1) = 1 → gradient −A
    neg = sapo(logp, logp.detach(), t([-1.0]), t([[1, 1]]), tau_pos=1.0, tau_neg=1.05)
    close(neg.per_token, [[2 / 1.05, 2 / 1.05]])


def test_sapo_gate_off_policy():
    logp, old = t([[0.0]], grad=True), t([[-math.log(1.5)]])  # ratio 1.5
    out = sapo(logp, old, t([1.0]), t([[1]]), tau_pos=2.0)
    sig = 1 / (1 + math.exp(-2.0 * 0.5))
    close(out.per_token, [[-sig * 4 / 2.0]])
    close(grad_of(out, logp), [[-4 * sig * (1 - sig) * 1.5]])  # −f'(r)·r·A


def test_gspo_sequence_ratio_value_gradient_and_clip():
    logp, old = t([[-1.0, -1.0]], grad=True), t([[-1.1, -0.7]])
    mask = t([[1, 1]])
    s = math.exp(-0.1)  # exp(mean(0.1, −0.3))
    out = gspo(logp, old, t([1.0]), mask, eps_low=0.2, eps_high=0.2)
    close(out.per_token, [[-s, -s]])
    close(grad_of(out, logp), [[-s, -s]])
    close(out.token_stats["ratio/mean"], [[s, s]])
    clipped = gspo(logp, old, t([-1.0]), mask, eps_low=0.05, eps_high=0.05)  # s < 0.95 with A < 0
    close(clipped.per_token, [[0.95, 0.95]])
    close(grad_of(clipped, logp), [[0.0, 0.0]])
    close(clipped.token_stats["clip/low_frac"], [[1.0, 1.0]])


def test_gspo_ignores_padding_in_the_sequence_ratio():
    logp, old = t([[-1.0, -1.0]], grad=True), t([[-1.2, 5.0]])
    out = gspo(logp, old, t([1.0]), t([[1, 0]]), eps_low=0.3, eps_high=0.3)
    close(out.per_token[0, 0], -math.exp(0.2))  # the padded log-ratio (6.0) is left out


def test_gmpo_geometric_mean_with_pessimistic_log_clip():
    logp, mask = t([[0.0, 0.0]], grad=True), t([[1, 1]])
    old = t([[-0.1, 0.5]])  # log-ratios 0.1, −0.5
    pos = gmpo(logp, old, t([1.0]), mask, eps_low=0.4, eps_high=0.4)
    close(pos.per_token, [[-math.exp(-0.2)] * 2])  # A > 0 keeps −0.5 (min), mean −0.2
    neg = gmpo(logp, old, t([-1.0]), mask, eps_low=0.4, eps_high=0.4)
    close(neg.per_token, [[math.exp(-0.15)] * 2])  # A < 0 clips −0.5 to −0.4, mean −0.15
    high = gmpo(logp, t([[-0.6, -0.6]]), t([1.0]), mask, eps_low=0.4, eps_high=0.4)
    close(high.per_token, [[-math.exp(0.4)] * 2])  # 0.6 clipped to 0.4 for A > 0
    close(grad_of(high, logp), [[0.0, 0.0]])


def test_gmpo_single_token_and_empty_row():
    logp = t([[-1.0, 0.0], [0.0, 0.0]], grad=True)
    out = gmpo(logp, logp.detach(), t([2.0, 3.0]), t([[1, 0], [0, 0]]))
    close(out.per_token[0], [-2.0, -2.0])
    assert torch.isfinite(out.per_token).all()


def test_clip_cov_detaches_random_in_band_covariance_tokens():
    # adv (per token) 3, −3, 6, −6; logp 0, −2, 0, −2 → means 0 and −1 → cov 3, 3, 6, 6;
    # only tokens 0 and 1 lie in (1, 5)
    logp = t([[0.0, -2.0, 0.0, -2.0]], grad=True)
    adv, mask = t([[3.0, -3.0, 6.0, -6.0]]), t([[1, 1, 1, 1]])
    g = torch.Generator().manual_seed(0)
    one = clip_cov(logp, logp.detach(), adv, mask, clip_ratio=2e-4, generator=g)
    zeroed = (one.token_stats["cov/detached_frac"] == 1).nonzero()[:, 1].tolist()
    assert len(zeroed) == 1 and zeroed[0] in (0, 1)
    both = clip_cov(logp, logp.detach(), adv, mask, clip_ratio=1.0)
    close(both.per_token, [[0.0, 0.0, -6.0, 6.0]])
    close(grad_of(both, logp), [[0.0, 0.0, -6.0, 6.0]])


def test_clip_cov_skips_tokens_the_ppo_clip_already_clipped():
    logp = t([[0.0, -2.0, 0.0, -2.0]], grad=True)
    old = t([[-0.5, -2.0, 0.0, -2.0]])  # token 0: ratio e^0.5 > 1.2 with A > 0 → PPO-clipped
    adv, mask = t([[3.0, -3.0, 6.0, -6.0]]), t([[1, 1, 1, 1]])
    out = clip_cov(logp, old, adv, mask, clip_ratio=1.0)
    close(out.token_stats["cov/detached_frac"], [[0.0, 1.0, 0.0, 0.0]])
    close(out.per_token, [[-3.0 * 1.2, 0.0, -6.0, 6.0]])


def test_kl_cov_penalises_the_top_covariance_token():
    # adv 2, 0, −2; logp −1, −2, −2 → cov (2)(2/3), 0, (−2)(−1/3) → top-1 is token 0
    logp = t([[-1.0, -2.0, -2.0]], grad=True)
    old = t([[-1.2, -2.0, -2.1]])
    out = kl_cov(logp, old, t([[2.0, 0.0, -2.0]]), t([[1, 1, 1]]), kl_ratio=0.34, kl_coef=1.0)
    close(out.per_token, [[-2 * math.exp(0.2) + 0.2, 0.0, 2 * math.exp(0.1)]])
    close(out.token_stats["cov/penalised_frac"], [[1.0, 0.0, 0.0]])


def test_kl_cov_never_selects_padding_and_handles_all_masked():
    logp = t([[-1.0, 0.0]], grad=True)
    out = kl_cov(logp, t([[-1.5, -9.0]]), t([[1.0, 50.0]]), t([[1, 0]]), kl_ratio=1.0)
    close(out.token_stats["cov/penalised_frac"], [[1.0, 0.0]])
    empty = kl_cov(logp, logp.detach(), t([1.0]), t([[0, 0]]))
    assert torch.isfinite(empty.per_token).all() and empty.token_stats["cov/penalised_frac"].sum() == 0


def test_ppo_clip_dual_clip_unchanged():
    logp, old = t([[0.0]], grad=True), t([[-math.log(5.0)]])  # ratio 5 with A < 0
    out = ppo_clip(logp, old, t([-1.0]), t([[1]]), eps_low=0.2, dual_clip=3.0)
    close(out.per_token, [[3.0]])
