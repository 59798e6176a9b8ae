"""CAPO (arXiv 2510.00819): the last-layer curvature model, its Adam moment model and the token mask, by hand; the
update leaves GRPO's only where tokens are masked; a two-step run on the tiny model logs the masked share."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.regularisers.curvature import (
    CURVATURE_FEATURES,
    AdamMoments,
    CurvatureMask,
    curvature_scores,
    threshold_mask,
)
from rlexp.core.masks import CURVATURE_HIDDEN, CURVATURE_TOPK_IDX, CURVATURE_TOPK_LOGP
from rlexp.trainer.optimize import batch_logprobs, policy_update
from tests.algorithms.batches import make_batch, tiny_policy, token_batch

# Two tokens over a 3-token vocabulary (top-K = the whole vocabulary, ids 0, 1, 2), π = (0.5, 0.25, 0.25) at both.
# Token 1: sampled id 0, A = 1, h = (1, 0).  Token 2: sampled id 1, A = −1, h = (0, 2).
PI = torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]])
PICKED = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
H = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
IDS = torch.tensor([[0, 1, 2], [0, 1, 2]])
ADV = torch.tensor([1.0, -1.0])


def test_curvature_of_the_per_token_outer_product_gradient_hand_computed():
    """Before the moment model's first step d = g = A·v ⊗ h, so u_j = d_j·h = A·v_j·‖h‖² and s = v·u.
    Token 1: v = (0.5, −0.25, −0.25), ‖h‖² = 1: u = (0.5, −0.25, −0.25), s = 0.25 + 0.0625 + 0.0625 = 0.375;
      Σπu = 0.25 − 0.0625 − 0.0625 = 0.125, Σπu² = 0.125 + 0.015625 + 0.015625 = 0.15625, uᵀFu = 0.15625 − 0.125²
      = 0.140625; Hessian term A·(s² − uᵀFu) = 0.140625 − 0.140625 = 0; η = 0.1: objective shift η·A·s = 0.0375,
      policy shift ½η²s² = 0.005·0.140625 = 0.000703125.
    Token 2: v = (−0.5, 0.75, −0.25), ‖h‖² = 4, A = −1: u = −4v = (2, −3, 1), s = −1 − 2.25 − 0.25 = −3.5;
      Σπu = 1 − 0.75 + 0.25 = 0.5, Σπu² = 2 + 2.25 + 0.25 = 4.5, uᵀFu = 4.5 − 0.25 = 4.25; Hessian term
      −(12.25 − 4.25) = −8; objective shift 0.1·(−1)·(−3.5) + 0.005·(−8) = 0.35 − 0.04 = 0.31; policy shift
      0.005·12.25 = 0.06125."""
    objective, policy = curvature_scores(H, PI, PICKED, IDS, ADV, 0.1, AdamMoments(), chunk=1)
    torch.testing.assert_close(objective, torch.tensor([0.0375, 0.31]))
    torch.testing.assert_close(policy, torch.tensor([0.000703125, 0.06125]))
    # τ_H = 0.1, τ_F = 0.01: token 1 passes both tests, token 2 fails both
    keep_h, keep_f = threshold_mask(objective, policy, hessian_tau=0.1, fisher_tau=0.01, symmetric=True)
    assert keep_h.tolist() == [True, False] and keep_f.tolist() == [True, False]


def test_threshold_mask_symmetric_one_sided_and_off():
    objective = torch.tensor([0.05, -0.05, 0.2, -0.2])
    policy = torch.tensor([1e-5, 2e-4, 1e-5, 1e-5])
    keep_h, keep_f = threshold_mask(objective, policy, 0.1, 1e-4, symmetric=True)  # |shift| < 0.1; KL < 1e-4
    assert keep_h.tolist() == [True, True, False, False] and keep_f.tolist() == [True, False, True, True]
    keep_h, _ = threshold_mask(objective, policy, 0.1, 1e-4, symmetric=False)  # 0 ≤ shift < 0.1
    assert keep_h.tolist() == [True, False, False, False]
    keep_h, keep_f = threshold_mask(objective, policy, 0.0, 0.0, symmetric=True)  # τ = 0: that test is off
    assert keep_h.all() and keep_f.all()


def test_the_scores_are_the_second_order_model_of_the_ratio_objective():
    """With K = V the objective shift is η·J'(0) + ½η²·J''(0) of J(η) = A·π_a(z + ηu)/π_a(z), and the policy shift
    ½η²·(d/dη log π_a)², for a random direction from the moment model (autograd, float64)."""
    torch.manual_seed(0)
    V, D = 5, 4
    h = torch.randn(1, D, dtype=torch.float64)
    W = torch.randn(V, D, dtype=torch.float64)
    pi = torch.softmax(W @ h[0], -1)[None]
    picked = torch.zeros(1, V, dtype=torch.float64)
    picked[0, 2] = 1.0
    adv = torch.tensor([-0.7], dtype=torch.float64)
    ids = torch.arange(V)[None]
    moments = AdamMoments(beta1=0.9, beta2=0.99, eps=1e-8)
    moments.t = 3
    moments.m = 0.1 * torch.randn(V, D, dtype=torch.float64)
    moments.v = 0.01 * torch.rand(V, D, dtype=torch.float64)
    lr = 0.05
    objective, policy = curvature_scores(h, pi, picked, ids, adv, lr, moments, chunk=4)
    d = moments.direction(ids, (adv[:, None] * (picked - pi))[..., None] * h[:, None, :])[0]
    eta = torch.zeros((), dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax((W + eta * d) @ h[0], -1)[2]
    J = adv[0] * torch.exp(logp - logp.detach())
    (j1,) = torch.autograd.grad(J, eta, create_graph=True)
    (j2,) = torch.autograd.grad(j1, eta)
    (l1,) = torch.autograd.grad(torch.log_softmax((W + eta * d) @ h[0], -1)[2], eta)
    torch.testing.assert_close(objective[0], (lr * j1 + 0.5 * lr**2 * j2).detach())
    torch.testing.assert_close(policy[0], 0.5 * lr**2 * l1**2)


def test_adam_direction_hand_computed():
    """β1 = β2 = 0.5, ε = 0, one step so far (bias corrections at t = 2: 1 − 0.25 = 0.75 each), H = 1.
    id 7: m = 0.5, v = 0.5, g = 1: m' = 0.25 + 0.5 = 0.75, v' = 0.25 + 0.5 = 0.75, d = (0.75/0.75)/√1 = 1.
    id 3: m = −0.5, v = 0.5, g = −1: d = −1. id 9 (never seen: m = v = 0), g = 2: m' = 1, v' = 2,
    d = (1/0.75)/√(2/0.75) = √(2/3). Before any step the direction is the gradient itself."""
    moments = AdamMoments(beta1=0.5, beta2=0.5, eps=0.0)
    g = torch.tensor([[[1.0], [-1.0], [2.0]]])
    ids = torch.tensor([[7, 3, 9]])
    torch.testing.assert_close(moments.direction(ids, g), g)
    moments.t = 1
    moments.m = torch.zeros(10, 1)
    moments.v = torch.zeros(10, 1)
    moments.m[7], moments.v[7], moments.m[3], moments.v[3] = 0.5, 0.5, -0.5, 0.5
    d = moments.direction(ids, g)
    torch.testing.assert_close(d[0, :, 0], torch.tensor([1.0, -1.0, math.sqrt(2 / 3)]))
    assert AdamMoments("sgd").direction(ids, g) is g


def test_moment_step_averages_each_ids_gradient_over_its_occurrences():
    """Both tokens of the first test kept: id 0's per-token gradients A·v_0·h are 0.5·(1, 0) and
    (−1)(−0.5)·(0, 2) = (0, 1), mean (0.25, 0.5); β1 = 0.9, β2 = 0.99 from zero moments: m = 0.1·(0.25, 0.5),
    v = 0.01·(0.0625, 0.25). id 2: token 1 gives 1·(−0.25)·(1, 0), token 2 (−1)(−0.25)·(0, 2) = (0, 0.5): mean
    (−0.125, 0.25). An id in no kept token's top-K keeps its rows."""
    moments = AdamMoments(beta1=0.9, beta2=0.99)
    coef = ADV[:, None] * (PICKED - PI)
    moments.update(IDS, coef, H, chunk=1)
    assert moments.t == 1
    torch.testing.assert_close(moments.m[0], torch.tensor([0.025, 0.05]))
    torch.testing.assert_close(moments.v[0], torch.tensor([0.000625, 0.0025]))
    torch.testing.assert_close(moments.m[2], torch.tensor([-0.0125, 0.025]))
    assert moments.m[3:].abs().sum() == 0  # rows beyond the ids seen stay zero
    moments.update(IDS[:1, :1], coef[:1, :1], H[:1], chunk=1)  # only id 0 from token 1: 0.5·(1, 0)
    torch.testing.assert_close(moments.m[0], torch.tensor([0.9 * 0.025 + 0.05, 0.9 * 0.05]))
    torch.testing.assert_close(moments.m[2], torch.tensor([-0.0125, 0.025]))  # untouched


def _hand_batch():
    b = make_batch([1.0], [0], lengths=[2], width=2)
    b.completion_ids = torch.tensor([[0, 1]])
    b.advantages = ADV[None, :]  # per-token advantages (1, −1)
    b.extras[CURVATURE_HIDDEN] = H[None]
    b.extras[CURVATURE_TOPK_IDX] = IDS[None]
    b.extras[CURVATURE_TOPK_LOGP] = PI.log()[None]
    return b


def test_the_mask_drops_the_unstable_token_and_steps_the_moments_on_the_kept_one():
    """The two tokens above in one row (temperature 1, η = 0.1): token 2 is masked by both tests; the moment
    model's first step sees token 1 only, m_0 = 0.1·0.5·(1, 0) = (0.05, 0)."""
    cm = CurvatureMask(fisher_tau=0.01, hessian_tau=0.1, betas=[0.9, 0.99], eps=1e-8)
    b = _hand_batch()
    keep, counts = cm(b, b.completion_mask, lr=0.1, temperature=1.0)
    assert keep.tolist() == [[1, 0]]
    assert counts["tokens"] == 2 and counts["masked"] == 1 and counts["hessian"] == 1 and counts["fisher"] == 1
    assert counts["objective_abs"] == pytest.approx(0.0375 + 0.31) and counts["policy_max"] == pytest.approx(0.06125)
    assert not any(k in b.extras for k in CURVATURE_FEATURES)  # consumed
    torch.testing.assert_close(cm.moments.m[0], torch.tensor([0.05, 0.0]))
    assert cm.moments.t == 1
    # the temperature divides h: at τ = 2 token 2 has u = −v, s = −0.875: objective shift 0.0875 − 0.0025 = 0.085 < 0.1,
    # policy shift 0.0038 < 0.01
    b = _hand_batch()
    keep, _ = CurvatureMask(fisher_tau=0.01, hessian_tau=0.1)(b, b.completion_mask, lr=0.1, temperature=2.0)
    assert keep.tolist() == [[1, 1]]


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match="fisher_tau"):
        CurvatureMask(fisher_tau=-1.0)
    with pytest.raises(ValueError, match="both 0"):
        CurvatureMask(fisher_tau=0.0, hessian_tau=0.0)
    with pytest.raises(ValueError, match="optimizer_model"):
        CurvatureMask(optimizer_model="lion")
    with pytest.raises(ValueError, match="betas"):
        CurvatureMask(betas=[0.9])
    with pytest.raises(ValueError, match="curvature_mask"):
        Algorithm(name="x", advantage=lambda b: b.advantages, loss=ppo_clip, curvature_mask=object())
    with pytest.raises(ValueError, match="curvature_mask"):
        CurvatureMask()(make_batch([1.0], [0]), torch.ones(1, 2), lr=0.1)  # no features from the old forward


def test_the_old_forward_keeps_the_lm_heads_inputs_and_top_k():
    """The kept hidden states are the LM head's inputs: their logits' top-K at temperature τ are the kept ones; the
    log-probs are those of the plain forward."""
    model = tiny_policy()
    batch = token_batch(n_groups=2, g=2, seed=3)
    plain = batch_logprobs(model, batch, 0, 0.7)
    out: dict = {}
    lp = batch_logprobs(model, batch, 2, 0.7, token_out=out, curvature_topk=5)
    torch.testing.assert_close(lp, plain)
    feats = out["curvature"]
    h, idx, tlp = feats[CURVATURE_HIDDEN], feats[CURVATURE_TOPK_IDX], feats[CURVATURE_TOPK_LOGP]
    assert h.shape == (4, 4, 16) and idx.shape == (4, 4, 5) and tlp.shape == (4, 4, 5)
    with torch.no_grad():
        full = torch.log_softmax(model.lm_head(h) / 0.7, -1)
    m = batch.completion_mask.bool()
    torch.testing.assert_close(full.topk(5, -1).values[m], tlp[m], rtol=1e-4, atol=1e-5)
    picked = full.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(picked[m], plain[m], rtol=1e-4, atol=1e-5)


def _update(curvature_mask, seed=0):
    torch.manual_seed(seed)
    model = tiny_policy()
    batch = token_batch(n_groups=2, g=2, seed=5)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    out: dict = {}
    batch.old_logprobs = batch_logprobs(model, batch, 0, 1.0, token_out=out, curvature_topk=8)
    batch.extras.update(out["curvature"])
    algo = Algorithm(name="capo", advantage=lambda b: b.advantages, loss=ppo_clip, curvature_mask=curvature_mask)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    m = policy_update(
        model, opt, None, batch, algo, mu=1, micro_batch=0, temperature=1.0, max_grad_norm=None, steps_per_rollout=2
    )
    return model, m


def test_the_update_is_grpos_when_nothing_is_masked_and_leaves_it_when_tokens_are():
    """Two mini-batch steps per rollout (the ratio leaves 1 on the second). Thresholds no token reaches: the weights
    after the update are GRPO's (the PPO clip alone). Thresholds between the mean and the largest policy shift: some
    tokens, not all, leave the loss and its normalisers, and the update differs."""
    grpo, m_grpo = _update(None)
    assert not any(k.startswith("capo/") for k in m_grpo)
    same, m_same = _update(CurvatureMask(fisher_tau=1e9, hessian_tau=1e9))
    assert m_same["capo/masked_token_frac"] == 0.0 and m_same["capo/moment_steps"] == 2.0
    assert m_same["capo/policy_shift_mean"] > 0 and m_same["train/optimizer_steps"] == 2.0
    for p, q in zip(grpo.parameters(), same.parameters()):
        torch.testing.assert_close(p, q)
    tau = 0.5 * (m_same["capo/policy_shift_mean"] + m_same["capo/policy_shift_max"])
    masked, m_masked = _update(CurvatureMask(fisher_tau=tau, hessian_tau=1e9))
    assert 0.0 < m_masked["capo/masked_token_frac"] < 1.0
    assert m_masked["capo/fisher_masked_frac"] == m_masked["capo/masked_token_frac"]
    assert any(not torch.allclose(p, q) for p, q in zip(grpo.parameters(), masked.parameters()))


def test_capo_two_steps_on_the_tiny_model_log_the_masked_share(tiny_cfg):
    """The tiny model (hidden size 64) at lr 1e-5 has policy shifts of ~1e-7, far below SmolLM2's scale: τ_F = 1e-7
    makes the mask act; 2 mini-batch steps per rollout (2 groups), 4 moment-model steps in all."""
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
    result = run(tiny_cfg(*VARYING, *fast, "algorithm=capo", "algorithm.curvature_mask.fisher_tau=1.0e-7"))
    m = result.metrics
    assert result.last_step == 2 and m["train/optimizer_steps"] == 2.0 and m["capo/moment_steps"] == 4.0
    assert 0.0 < m["capo/masked_token_frac"] < 1.0
    assert m["capo/policy_shift_mean"] > 0 and m["capo/objective_shift_abs_mean"] > 0
    assert math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])


@pytest.mark.long
def test_capo_moment_model_resumes_from_the_checkpoint(tiny_cfg):
    """A run stopped after step 2 and resumed to step 3 continues the moment model (2 steps per training step):
    6 moment steps at step 3, not 2 as a fresh model would count."""
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2", "algorithm=capo"]
    run(tiny_cfg(*VARYING, *fast, "trainer.checkpoint_every=1"))
    again = run(tiny_cfg(*VARYING, *fast, "trainer.checkpoint_every=1", "trainer.max_steps=3", "trainer.resume=true"))
    assert again.last_step == 3 and again.metrics["capo/moment_steps"] == 6.0
