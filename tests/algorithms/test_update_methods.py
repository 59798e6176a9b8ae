"""Issue 20 §3, methods that act on the update: MDPO (KL to the sampling policy in place of the clip), SFPO
(fast steps, reposition, slow correction), CoPG (contrastive pairs, no importance weights), A-LoL (advantage-
filtered, clipped sequence importance weight). Values and gradients computed by hand; where the rollout's
policy and the current one differ (several steps per rollout) the gradient leaves GRPO's, and where the paper
says it should it coincides."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.algorithm import Algorithm, SlowFastSettings
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.mirror import MirrorDescent
from rlexp.algorithms.regularisers.kl import kl_to_sampler
from rlexp.trainer.optimize import batch_logprobs, policy_update
from rlexp.trainer.slow_fast import SlowFastSchedule, reposition, snapshot
from tests.algorithms.batches import tiny_policy, token_batch


def _grad(loss_fn, logp0, old, adv, mask):
    logp = logp0.clone().requires_grad_(True)
    out = loss_fn(logp, old, adv, mask)
    (out.per_token * mask).sum().backward()
    return logp.grad, out


# ------------------------------------------------------------------------------------------------ MDPO


def test_kl_to_sampler_hand_computed():
    """log r = 0.5, 0, −1: r log r − r + 1 = 0.5e^0.5 − e^0.5 + 1, 0, −e^−1 − e^−1 + 1; gradient r log r."""
    logp = torch.tensor([-0.5, -1.0, -3.0], requires_grad=True)
    old = torch.tensor([-1.0, -1.0, -2.0])
    kl = kl_to_sampler(logp, old)
    e, ei = math.exp(0.5), math.exp(-1.0)
    torch.testing.assert_close(kl.detach(), torch.tensor([0.5 * e - e + 1, 0.0, -ei - ei + 1]))
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.5 * e, 0.0, -ei]))
    assert (kl >= 0).all()


def test_mdpo_loss_hand_computed_and_annealed():
    """ℓ = −r·A + KL/t_k; t_k = 1 − (k − 1)/K: step 3 of 4 gives t = 0.5, a KL weight of 2."""
    loss = MirrorDescent(step_size=1.0, anneal=True)
    loss.on_step(3, 4)
    assert loss.current == pytest.approx(0.5)
    logp = torch.tensor([[-0.5, -1.0]])
    old = torch.tensor([[-1.0, -1.0]])
    adv = torch.tensor([2.0])
    out = loss(logp, old, adv, torch.ones(1, 2))
    e = math.exp(0.5)
    torch.testing.assert_close(out.per_token, torch.tensor([[-2 * e + 2 * (0.5 * e - e + 1), -2.0]]))
    assert out.token_stats["mdpo/kl_coef"][0, 0].item() == pytest.approx(2.0)
    loss.on_step(4, 4)
    assert loss.current == pytest.approx(0.25)
    fixed = MirrorDescent(step_size=0.5, anneal=False)
    fixed.on_step(4, 4)
    assert fixed.current == 0.5


def test_mdpo_gradient_is_grpos_on_policy_and_differs_off_policy():
    """On the rollout's first step (π_θ = π_old) the KL term has no gradient and neither loss clips: MDPO's
    gradient is PPO-clip's, −A·∇log π (the paper: the first step of each mirror-descent update is the policy
    gradient). Off-policy, the KL pulls back and no clip cuts the ratio: they differ."""
    mask = torch.ones(2, 3)
    adv = torch.tensor([1.0, -1.0])
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    mdpo = MirrorDescent(anneal=False)
    g_mdpo, _ = _grad(mdpo, logp, logp.detach(), adv, mask)
    g_grpo, _ = _grad(ppo_clip, logp, logp.detach(), adv, mask)
    torch.testing.assert_close(g_mdpo, g_grpo)
    old = logp + torch.tensor([[0.5, -0.1, 0.3], [-0.4, 0.2, 0.1]])  # r = e^−0.5 ... : some outside [0.8, 1.2]
    g_mdpo, out = _grad(mdpo, logp, old, adv, mask)
    g_grpo, _ = _grad(ppo_clip, logp, old, adv, mask)
    assert not torch.allclose(g_mdpo, g_grpo)
    r = torch.exp(logp - old)
    torch.testing.assert_close(g_mdpo, -r * adv[:, None] + r * torch.log(r))  # d/dlogπ of −rA + (r log r − r + 1)
    assert out.token_stats["mdpo/kl"].sum() > 0


def test_mdpo_kl_acts_from_the_second_of_several_full_batch_steps():
    torch.manual_seed(0)
    model = tiny_policy()
    batch = token_batch(n_groups=2, g=2, seed=1)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    batch.old_logprobs = batch_logprobs(model, batch, 0, 1.0)
    algo = Algorithm(name="mdpo", advantage=lambda b: b.advantages, loss=MirrorDescent(anneal=False), num_iterations=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    m = policy_update(model, opt, None, batch, algo, mu=3, micro_batch=0, temperature=1.0, max_grad_norm=None)
    assert m["train/optimizer_steps"] == 3.0
    assert m["mdpo/kl"] > 0 and m["mdpo/kl_coef"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ SFPO


def test_reposition_hand_computed():
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
    slow = snapshot(lin)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[3.0, -2.0]]))  # the fast trajectory moved by (2, −4)
    moved = reposition(lin, slow, 0.25)
    assert moved == pytest.approx(math.sqrt(20.0))
    torch.testing.assert_close(lin.weight.detach(), torch.tensor([[1.5, 1.0]]))  # θ_0 + 0.25·(2, −4)


def test_entropy_zscore_switches_sfpo_off_for_good():
    sched = SlowFastSchedule(SlowFastSettings(fast_steps=2, stop_window=3, stop_threshold=1.0))
    for step, h in enumerate([1.0, 1.0, 1.0], 1):  # z = 0 (std 1e-9): still on
        sched.observe(h, step)
    assert sched.active
    sched.observe(2.0, 4)  # window [1, 1, 2]: mean 4/3, std √2/3, z = (2/3)/(√2/3) = √2 ≥ 1
    assert not sched.active and sched.stopped_at == 4
    sched.observe(1.0, 5)
    assert not sched.active
    again = SlowFastSchedule(SlowFastSettings(fast_steps=2, stop_window=3, stop_threshold=1.0))
    again.replay([{"step": s, "entropy/mean": h} for s, h in [(4, 2.0), (1, 1.0), (2, 1.0), (3, 1.0)]], upto=3)
    assert again.active  # step 4 is after the checkpoint: not replayed
    assert not SlowFastSchedule(SlowFastSettings(fast_steps=0)).active


def _sfpo_update(alpha, fast_steps, mu=1, k=1):
    torch.manual_seed(0)
    model = tiny_policy()
    batch = token_batch(n_groups=2, g=2, seed=2)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    batch.old_logprobs = batch_logprobs(model, batch, 0, 1.0)
    algo = Algorithm(name="s", advantage=lambda b: b.advantages, loss=ppo_clip, aggregation="token-mean")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # stateless: passes compose exactly
    sf = SlowFastSettings(fast_steps=fast_steps, step_size=alpha) if fast_steps else None
    m = policy_update(
        model, opt, None, batch, algo, mu=mu, micro_batch=0, temperature=1.0, max_grad_norm=None,
        steps_per_rollout=k, slow_fast=sf,
    )  # fmt: skip
    return m, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_sfpo_alpha_zero_is_one_plain_pass_and_alpha_one_is_k_plus_one_passes():
    """α = 0 puts the weights back to θ_0 before the slow pass: the update is one plain pass. α = 1 keeps the
    fast trajectory: the update is K + 1 passes with the old log-probs fixed at θ_0 (μ = K + 1 epochs)."""
    m, theta = _sfpo_update(alpha=0.0, fast_steps=2)
    assert m["train/optimizer_steps"] == 3.0 and m["sfpo/active"] == 1.0 and m["sfpo/fast_displacement"] > 0
    _, plain = _sfpo_update(alpha=0.0, fast_steps=0)
    torch.testing.assert_close(theta, plain)
    _, full = _sfpo_update(alpha=1.0, fast_steps=2)
    _, epochs = _sfpo_update(alpha=1.0, fast_steps=0, mu=3)
    torch.testing.assert_close(full, epochs)
    _, half = _sfpo_update(alpha=0.5, fast_steps=2)
    assert not torch.allclose(half, plain) and not torch.allclose(half, epochs)
    m, _ = _sfpo_update(alpha=0.8, fast_steps=1, k=2)  # mini-batches: (K + 1)·k steps
    assert m["train/optimizer_steps"] == 4.0


# ------------------------------------------------------------------------------------------------ CoPG


def test_copg_coefficient_hand_computed():
    """One group of 3, β = 0.5. R = 1, 0, 0 → leave-one-out contrast 1, −0.5, −0.5. h = Σ_t (log π − log π_ref)
    = 0.2, −0.4, 0.2 → h_i − mean_{j≠i} h_j = 0.3, −0.6, 0.3. A = 1 − 0.15, −0.5 + 0.3, −0.5 − 0.15."""
    from rlexp.algorithms.losses.contrastive import ContrastivePG
    from tests.algorithms.batches import make_batch

    b = make_batch([1.0, 0.0, 0.0], [0, 0, 0], lengths=[2, 2, 1], width=2)
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -5.0]])
    b.ref_logprobs = logp - torch.tensor([[0.1, 0.1], [-0.2, -0.2], [0.2, 9.0]])  # the padded 9.0 must not count
    mask = b.completion_mask.float()
    loss = ContrastivePG(beta=0.5)
    assert loss.needs_reference and not ContrastivePG(beta=0.0).needs_reference
    sel = loss.select(logp, logp, torch.tensor([1.0, -0.5, -0.5]), mask, batch=b)
    torch.testing.assert_close(sel[:, 0], torch.tensor([0.85, -0.2, -0.65]))
    out = loss(logp, logp, torch.tensor([1.0, -0.5, -0.5]), mask, selected=sel)
    torch.testing.assert_close(out.per_token, -sel * logp)
    with pytest.raises(ValueError, match="select"):
        loss(logp, logp, torch.tensor([1.0, -0.5, -0.5]), mask)


def test_copg_gradient_is_the_squared_pair_loss_gradient():
    """G = 2: the surrogate's gradient equals that of the paper's (R − R' − β(h − h'))²/(2β) through the
    current log-probs (h = ln π/π_ref of the sequence), whatever the policy that sampled."""
    from rlexp.algorithms.advantages.leave_one_out import rloo
    from rlexp.algorithms.losses.contrastive import ContrastivePG
    from tests.algorithms.batches import make_batch

    beta = 0.3
    b = make_batch([1.0, 0.2], [0, 0], lengths=[3, 2], width=3)
    mask = b.completion_mask.float()
    logp0 = torch.tensor([[-0.5, -1.5, -0.2], [-2.0, -0.1, 0.0]])
    b.ref_logprobs = torch.tensor([[-0.7, -1.0, -0.1], [-1.0, -0.4, 0.0]])
    h = lambda lp: ((lp - b.ref_logprobs) * mask).sum(-1)  # noqa: E731
    logp = logp0.clone().requires_grad_(True)
    hh = h(logp)
    pair = ((b.reward[0] - b.reward[1]) - beta * (hh[0] - hh[1])) ** 2 / (2 * beta)
    pair.backward()
    g_pair = logp.grad.clone()
    loss = ContrastivePG(beta=beta)
    old = logp0 + 0.7  # an older sampling policy: CoPG does not look at it
    sel = loss.select(logp0, old, rloo(b), mask, batch=b)
    g, _ = _grad(lambda lp, o, a, m: loss(lp, o, a, m, selected=sel), logp0, old, rloo(b), mask)
    torch.testing.assert_close(g * mask, g_pair * mask)


def test_copg_is_the_policy_gradient_on_policy_and_leaves_grpo_off_policy():
    """β = 0, on-policy: the gradient is −A·∇log π, PPO-clip's at ratio 1 with the same (leave-one-out)
    advantages (the paper: CoPG generalises the policy gradient). Off-policy the clipped ratio changes PPO's
    gradient; CoPG's stays the same (no importance sampling)."""
    from rlexp.algorithms.losses.contrastive import ContrastivePG

    mask = torch.ones(2, 2)
    adv = torch.tensor([0.5, -0.5])
    logp = torch.tensor([[-1.0, -2.0], [-0.3, -1.1]])
    copg = ContrastivePG(beta=0.0)
    g_copg, _ = _grad(copg, logp, logp.detach(), adv, mask)
    g_grpo, _ = _grad(ppo_clip, logp, logp.detach(), adv, mask)
    torch.testing.assert_close(g_copg, g_grpo)
    old = logp - torch.tensor([[0.6, -0.5], [0.1, 0.4]])
    g_copg_off, _ = _grad(copg, logp, old, adv, mask)
    g_grpo_off, _ = _grad(ppo_clip, logp, old, adv, mask)
    torch.testing.assert_close(g_copg_off, g_copg)
    assert not torch.allclose(g_grpo_off, g_copg_off)


def test_copg_in_the_update_uses_the_current_log_probs():
    """Through policy_update (2 mini-batch steps): select sees the current weights each step, so the β-term
    (copg/kl_term_abs) is non-zero once the policy has left the reference."""
    from rlexp.algorithms.advantages.leave_one_out import rloo
    from rlexp.algorithms.losses.contrastive import ContrastivePG

    torch.manual_seed(0)
    model = tiny_policy()
    ref = tiny_policy(seed=1)
    batch = token_batch(n_groups=2, g=2, seed=4)
    batch.ref_logprobs = batch_logprobs(ref, batch, 0, 1.0)
    batch.old_logprobs = batch_logprobs(model, batch, 0, 1.0)
    batch.advantages = rloo(batch)
    algo = Algorithm(name="copg", advantage=rloo, loss=ContrastivePG(beta=0.1), aggregation="seq-mean-token-sum")
    assert algo.selects_over_mini_batch and algo.needs_reference
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    m = policy_update(
        model, opt, None, batch, algo, mu=1, micro_batch=1, temperature=1.0, max_grad_norm=None, steps_per_rollout=2,
    )  # fmt: skip
    assert m["train/optimizer_steps"] == 2.0 and m["copg/kl_term_abs"] > 0


# ------------------------------------------------------------------------------------------------ A-LoL


def test_a_lol_hand_computed():
    """Rows: A = 2 with sequence log-ratio 0.3 (w = e^0.3), A = 1 with log-ratio 1.0 (w = e ≥ 1.9: clipped to
    1.9), A = −1 (dropped). ℓ_t = −A⁺·w·log π, the weight without gradient; level=token clips per token."""
    from rlexp.algorithms.losses.offline import a_lol

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5], [-1.0, -1.0]])
    old = logp - torch.tensor([[0.1, 0.2], [0.5, 0.5], [0.0, 0.0]])
    mask = torch.ones(3, 2)
    adv = torch.tensor([2.0, 1.0, -1.0])
    g, out = _grad(a_lol, logp, old, adv, mask)
    w = torch.tensor([math.exp(0.3), 1.9, 1.0])
    a_plus = torch.tensor([2.0, 1.0, 0.0])
    torch.testing.assert_close(out.per_token, -(a_plus * w)[:, None] * logp)
    torch.testing.assert_close(g, -(a_plus * w)[:, None].expand(3, 2))
    assert out.token_stats["a_lol/dropped_frac"][:, 0].tolist() == [0.0, 0.0, 1.0]
    assert out.token_stats["a_lol/clipped_frac"][:, 0].tolist() == [0.0, 1.0, 0.0]
    tok = a_lol(logp, old, adv, mask, level="token")
    wt = torch.exp(torch.tensor([[0.1, 0.2], [0.5, 0.5], [0.0, 0.0]]))
    torch.testing.assert_close(tok.per_token, -a_plus[:, None] * wt * logp)
    with pytest.raises(ValueError, match="clip"):
        a_lol(logp, old, adv, mask, clip=1.0)


def test_a_lol_is_the_policy_gradient_on_positive_advantages_on_policy_only():
    """On-policy (w = 1) with positive advantages, A-LoL's gradient is PPO-clip's (−A·∇log π); negative-
    advantage rows get none (GRPO pushes them down); off-policy the sequence weight changes it."""
    from rlexp.algorithms.losses.offline import a_lol

    mask = torch.ones(2, 2)
    logp = torch.tensor([[-1.0, -2.0], [-0.3, -1.1]])
    pos = torch.tensor([0.5, 1.5])
    g_alol, _ = _grad(a_lol, logp, logp.detach(), pos, mask)
    g_grpo, _ = _grad(ppo_clip, logp, logp.detach(), pos, mask)
    torch.testing.assert_close(g_alol, g_grpo)
    mixed = torch.tensor([0.5, -1.5])
    g_alol, _ = _grad(a_lol, logp, logp.detach(), mixed, mask)
    g_grpo, _ = _grad(ppo_clip, logp, logp.detach(), mixed, mask)
    assert g_alol[1].abs().sum() == 0 and g_grpo[1].abs().sum() > 0
    old = logp - torch.tensor([[0.3, 0.3], [0.05, 0.05]])  # sequence ratios e^0.6, e^0.1
    g_off, _ = _grad(a_lol, logp, old, pos, mask)
    torch.testing.assert_close(g_off, -pos[:, None] * torch.exp(torch.tensor([[0.6], [0.1]])).expand(2, 2))
