"""The losses and settings issue 20 §2 adds for peer parity — DPPO-TV/KL, DRO, VESPO, sequence-level CISPO and
SAPO, INTELLECT-2's two-sided δ, token-sum — computed by hand; and, for each ratio method, its gradient against
GRPO's (ppo_clip): equal on-policy (ratio 1) where the method says so, different once old_logp != logp."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.losses.clip import cispo, ppo_clip
from rlexp.algorithms.losses.divergence import dppo_kl, dppo_tv
from rlexp.algorithms.losses.reinforce import dro
from rlexp.algorithms.losses.sequence import gspo
from rlexp.algorithms.losses.soft_gates import sapo, vespo

L = math.log


def grad_of(loss_fn, logp, old, adv, mask, mode="token-mean", **kw):
    lp = logp.clone().requires_grad_(True)
    out = loss_fn(lp, old, adv, mask, **kw)
    aggregate(out.per_token, mask, mode, Normaliser.from_mask(mask)).backward()
    return lp.grad, out


# ---------------------------------------------------------------- DPPO


def test_dppo_tv_hand_computed():
    """π_old = 0.3, 0.4 and π = 0.5, 0.2: π − π_old = +0.2, −0.2; δ = 0.15.
    A = +1: token 0 rose 0.2 > δ → masked; token 1 fell (−0.2 ≤ δ) → kept, r = 0.5: ℓ = −1·0.5·ln 0.2,
    gradient −A·r = −0.5. A = −1: token 0 rose (+0.2 ≥ −δ) → kept, r = 5/3: ℓ = +(5/3)·ln 0.5, gradient
    +5/3; token 1 fell 0.2 > δ → masked."""
    logp = torch.log(torch.tensor([[0.5, 0.2], [0.5, 0.2]]))
    old = torch.log(torch.tensor([[0.3, 0.4], [0.3, 0.4]]))
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    lp = logp.clone().requires_grad_(True)
    out = dppo_tv(lp, old, adv, mask, delta_low=0.15)
    want = torch.tensor([[0.0, -0.5 * L(0.2)], [(5 / 3) * L(0.5), 0.0]])
    torch.testing.assert_close(out.per_token.detach(), want, rtol=1e-5, atol=1e-6)
    out.per_token.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -0.5], [5 / 3, 0.0]]), rtol=1e-5, atol=1e-6)
    assert out.token_stats["dppo/masked_frac"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert out.token_stats["clip/high_frac"].tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert out.token_stats["clip/low_frac"].tolist() == [[0.0, 0.0], [0.0, 1.0]]
    # a wider region keeps all four; δ_high alone widens only the A > 0 side
    assert dppo_tv(logp, old, adv, mask, delta_low=0.25).token_stats["dppo/masked_frac"].sum() == 0
    wide_high = dppo_tv(logp, old, adv, mask, delta_low=0.15, delta_high=0.25).token_stats["dppo/masked_frac"]
    assert wide_high.tolist() == [[0.0, 0.0], [0.0, 1.0]]
    # the truncated-IS cap c = 1.5 on the kept r = 5/3 token: weight 1.5, gradient +1.5
    lp = logp.clone().requires_grad_(True)
    capped = dppo_tv(lp, old, adv, mask, delta_low=0.15, ratio_cap=1.5)
    capped.per_token.sum().backward()
    assert lp.grad[1, 0].item() == pytest.approx(1.5)
    assert capped.token_stats["dppo/truncated_frac"].tolist() == [[0.0, 0.0], [1.0, 0.0]]


def test_dppo_kl_hand_computed():
    """Binary KL D = π_old·ln(π_old/π) + (1 − π_old)·ln((1 − π_old)/(1 − π)).
    π_old 0.3 → π 0.5: D = 0.3·ln 0.6 + 0.7·ln 1.4 = −0.15325 + 0.23553 = 0.08228 (probability rose).
    π_old 0.4 → π 0.2: D = 0.4·ln 2 + 0.6·ln 0.75 = 0.27726 − 0.17261 = 0.10465 (probability fell).
    δ = 0.05. A = +1: the rise has D > δ → masked; the fall is against A → kept whatever D.
    A = −1: the rise is against A → kept; the fall has D > δ → masked. δ = 0.09: only the fall (0.105) is out."""
    d_rise = 0.3 * L(0.3 / 0.5) + 0.7 * L(0.7 / 0.5)
    d_fall = 0.4 * L(0.4 / 0.2) + 0.6 * L(0.6 / 0.8)
    assert d_rise == pytest.approx(0.08228, abs=1e-5) and d_fall == pytest.approx(0.10465, abs=1e-5)
    logp = torch.log(torch.tensor([[0.5, 0.2], [0.5, 0.2]]))
    old = torch.log(torch.tensor([[0.3, 0.4], [0.3, 0.4]]))
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    out = dppo_kl(logp, old, adv, mask, delta_low=0.05)
    assert out.token_stats["dppo/masked_frac"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    torch.testing.assert_close(out.per_token[0, 1], torch.tensor(-0.5 * L(0.2)))  # −A·r·ln π, r = 0.5
    assert dppo_kl(logp, old, adv, mask, delta_low=0.09).token_stats["dppo/masked_frac"].tolist() == [
        [0.0, 0.0],
        [0.0, 1.0],
    ]


# ---------------------------------------------------------------- DRO


def test_dro_hand_computed():
    """β = 0.5, A = 2, log r = 0.5 and 0: ℓ = −(2·(−1) − 0.25·0.25) = 2.0625 and −(2·(−2)) = 4;
    gradient −(A − β·log r) = −(2 − 0.25) = −1.75 and −2."""
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0]])
    out = dro(lp, old, torch.tensor([2.0]), torch.ones(1, 2), beta=0.5)
    torch.testing.assert_close(out.per_token.detach(), torch.tensor([[2.0625, 4.0]]))
    out.per_token.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.75, -2.0]]))
    with pytest.raises(ValueError, match="beta"):
        dro(lp, old, torch.tensor([2.0]), torch.ones(1, 2), beta=0.0)


# ---------------------------------------------------------------- VESPO


def test_vespo_hand_computed():
    """Row 0: A = +1, token log-ratios 0.4 + ln 2 − 0.4 = ln 2 (a padded token's 5.0 is left out): w = 2,
    φ = w^k·e^{λ(1−w)} = 4·e^{−3} (k = 2, λ = 3). Row 1: A = −1, log-ratios summing to −ln 2: w = 0.5,
    φ = 0.5³·e^{2·0.5} = e/8 (k = 3, λ = 2). Row 2: w = 1: φ = 1. ℓ = −φ·A·log π, gradient −φ·A."""
    lp = torch.tensor([[-1.0, -0.5, -0.2], [-1.0, -0.5, -0.2], [-1.0, -0.5, -0.2]], requires_grad=True)
    log_r = torch.tensor([[0.4, L(2.0) - 0.4, 5.0], [-L(2.0), 0.0, 0.0], [0.3, -0.3, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0, 0.5])
    out = vespo(lp, lp.detach() - log_r, adv, mask)
    phi = torch.tensor([4 * math.exp(-3), math.e / 8, 1.0])
    torch.testing.assert_close(out.token_stats["vespo/phi_mean"][:, 0], phi, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.token_stats["ratio/mean"][:, 0], torch.tensor([2.0, 0.5, 1.0]), rtol=1e-5, atol=0)
    (out.per_token * mask).sum().backward()
    torch.testing.assert_close(lp.grad, (-phi * adv)[:, None] * mask, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- sequence-level CISPO and SAPO


def test_cispo_sequence_level_hand_computed():
    """Token log-ratios 0.2, 0.4 (a padded 3.0 left out): sequence ratio e^{0.3} = 1.3499, capped at
    1 + ε_high = 1.2; per token ℓ = −1.2·A·log π (gradient −1.2·A on both tokens). Token level: e^{0.2} =
    1.2214 → 1.2 and e^{0.4} → 1.2 too; with ε_high = 0.3 the token level keeps 1.2214 and caps 1.4918 at
    1.3, the sequence level uses e^{0.3} = 1.3499 → 1.3 for both."""
    lp = torch.tensor([[-1.0, -0.5, -0.1]], requires_grad=True)
    old = lp.detach() - torch.tensor([[0.2, 0.4, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = cispo(lp, old, torch.tensor([2.0]), mask, eps_high=0.2, level="sequence")
    (out.per_token * mask).sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-2.4, -2.4, 0.0]]))
    tok = cispo(lp.detach(), old, torch.tensor([1.0]), mask, eps_high=0.3)
    torch.testing.assert_close(-tok.per_token[0, :2] / lp.detach()[0, :2], torch.tensor([math.exp(0.2), 1.3]))
    seq = cispo(lp.detach(), old, torch.tensor([1.0]), mask, eps_high=0.3, level="sequence")
    torch.testing.assert_close(-seq.per_token[0, :2] / lp.detach()[0, :2], torch.tensor([1.3, 1.3]))
    with pytest.raises(ValueError, match="level"):
        cispo(lp, old, torch.tensor([1.0]), mask, level="sentence")


def test_sapo_sequence_level_hand_computed():
    """Token log-ratios 0.2, 0.4: s = e^{0.3}; A = 1, τ = 1: value f(s) = 4σ(s − 1) on every token; per-token
    gradient −A·f'(s)·s = −4σ(x)(1 − σ(x))·s, x = s − 1 (the GSPO-token form: s·∇log π_t)."""
    lp = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    old = lp.detach() - torch.tensor([[0.2, 0.4]])
    out = sapo(lp, old, torch.tensor([1.0]), torch.ones(1, 2), level="sequence")
    s = math.exp(0.3)
    sig = 1 / (1 + math.exp(-(s - 1)))
    torch.testing.assert_close(out.per_token.detach(), torch.full((1, 2), -4 * sig))
    out.per_token.sum().backward()
    torch.testing.assert_close(lp.grad, torch.full((1, 2), -4 * sig * (1 - sig) * s))


# ---------------------------------------------------------------- INTELLECT-2 two-sided δ


def test_ppo_clip_delta_hand_computed():
    """ε = 0.2. A = −1, r = e = 2.718: GRPO's loss is −min(−e, −1.2) = e; with δ = 2 the unclipped ratio is
    capped first: −min(−2, −1.2) = 2 (gradient 0 — the cap is constant). A = +1, r = 1.15 inside the band:
    δ = 1.1 < 1 + ε caps it to 1.1 (loss −1.1), δ = 4 does nothing (loss −1.15)."""
    lp = torch.tensor([[1.0, L(1.15)]], requires_grad=True)
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    adv = torch.tensor([[-1.0, 1.0]])
    plain = ppo_clip(lp, old, adv, mask)
    torch.testing.assert_close(plain.per_token.detach(), torch.tensor([[math.e, -1.15]]))
    out = ppo_clip(lp, old, adv, mask, delta=2.0)
    torch.testing.assert_close(out.per_token.detach(), torch.tensor([[2.0, -1.15]]))
    out.per_token.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -1.15]]))
    torch.testing.assert_close(ppo_clip(lp, old, adv, mask, delta=1.1).per_token[0, 1], torch.tensor(-1.1))
    torch.testing.assert_close(ppo_clip(lp, old, adv, mask, delta=4.0).per_token[0, 1], torch.tensor(-1.15))
    with pytest.raises(ValueError, match="delta"):
        ppo_clip(lp, old, adv, mask, delta=1.0)


def test_delta_equals_dual_clip_when_above_the_band():
    """δ ≥ 1 + ε_high: TRL's δ and verl's dual clip c = δ are the same function (value and gradient)."""
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 6, generator=g) * 2
    old = logp + torch.randn(5, 6, generator=g) * 1.2
    adv, mask = torch.randn(5, 6, generator=g), torch.ones(5, 6)
    g_delta, out_delta = grad_of(ppo_clip, logp, old, adv, mask, delta=2.5, eps_high=0.28)
    g_dual, out_dual = grad_of(ppo_clip, logp, old, adv, mask, dual_clip=2.5, eps_high=0.28)
    torch.testing.assert_close(out_delta.per_token, out_dual.per_token)
    torch.testing.assert_close(g_delta, g_dual)
    assert (torch.exp(logp - old) > 2.5).any()  # the cap acted somewhere


# ---------------------------------------------------------------- token-sum


def test_token_sum_hand_computed_and_micro_batch_shares_add_up():
    """Σ l·m = 1 + 3 + 4 = 8, no normaliser; the two rows' shares 1 and 7 add up to it."""
    per_token = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    norm = Normaliser.from_mask(mask)
    assert aggregate(per_token, mask, "token-sum", norm).item() == 8.0
    parts = [aggregate(per_token[i : i + 1], mask[i : i + 1], "token-sum", norm).item() for i in range(2)]
    assert parts == [1.0, 7.0]


# ---------------------------------------------------------------- against GRPO (ppo_clip)

# (name, loss, settings, aggregation). LUSPO is GSPO's loss under seq-mean-token-sum; the GRPO it is set
# against is aggregated the same way (on-policy its per-token gradient is GRPO's, summed instead of averaged).
RATIO_METHODS = [
    ("dppo_tv", dppo_tv, {"delta_low": 0.15}, "seq-mean-token-sum-norm"),
    ("dppo_kl", dppo_kl, {"delta_low": 0.05}, "seq-mean-token-sum-norm"),
    ("dro", dro, {"beta": 0.05}, "token-mean"),
    ("vespo", vespo, {}, "token-mean"),
    ("luspo", gspo, {"eps_low": 2e-3, "eps_high": 2.5e-3}, "seq-mean-token-sum"),
    ("cispo_sequence", cispo, {"level": "sequence", "eps_high": 0.2}, "token-mean"),
    ("sapo_sequence", sapo, {"level": "sequence"}, "seq-mean-token-mean"),
    ("grpo_delta", ppo_clip, {"delta": 1.1}, "seq-mean-token-mean"),
]


def _tensors(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 2, 4, 5])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    logp = -torch.rand(4, 5, generator=g) * 1.5 - 0.05  # probabilities 0.21 ... 0.95: DPPO's masks can act
    adv = torch.tensor([1.0, -0.7, 0.4, -1.2])
    return logp, adv, mask


@pytest.mark.parametrize("name,loss,kw,mode", RATIO_METHODS, ids=[m[0] for m in RATIO_METHODS])
def test_on_policy_gradient_is_grpos(name, loss, kw, mode):
    """Ratio 1 (old_logp = logp): every one of these methods takes GRPO's gradient −A·∇log π per token."""
    logp, adv, mask = _tensors(0)
    got, _ = grad_of(loss, logp, logp.clone(), adv, mask, mode, **kw)
    want, _ = grad_of(ppo_clip, logp, logp.clone(), adv, mask, mode)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,loss,kw,mode", RATIO_METHODS, ids=[m[0] for m in RATIO_METHODS])
def test_off_policy_gradient_differs_from_grpos(name, loss, kw, mode):
    """old_logp != logp (as from the second optimiser step of a rollout on): the gradients part."""
    logp, adv, mask = _tensors(1)
    g = torch.Generator().manual_seed(2)
    old = logp + torch.randn(logp.shape, generator=g) * 0.4
    got, _ = grad_of(loss, logp, old, adv, mask, mode, **kw)
    want, _ = grad_of(ppo_clip, logp, old, adv, mask, mode)
    assert not torch.allclose(got, want, rtol=1e-3, atol=1e-4), name


# ---------------------------------------------------------------- the settings in a run


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm=cispo", "algorithm.loss.level=sequence"],
        ["algorithm=sapo", "algorithm.loss.level=sequence"],
        ["algorithm=grpo", "algorithm.loss.delta=4.0", "algorithm.aggregation=token-sum"],
    ],
    ids=["cispo_sequence", "sapo_sequence", "grpo_delta_token_sum"],
)
def test_settings_train_two_steps_on_tiny(overrides, tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.test_methods_run import FAST
    from tests.algorithms.varying_reward import VARYING

    m = run(tiny_cfg(*VARYING, *FAST, *overrides)).metrics
    assert math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"]) and m["advantage/abs_mean"] > 0
