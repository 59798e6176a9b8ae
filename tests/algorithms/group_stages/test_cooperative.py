"""BRIDGE's bilevel teacher (rlexp/algorithms/group_stages/cooperative.py): the clip factor, the teacher's gradient
through W = θ + s·B·A, the surrogate cooperative gain and one whole teacher/shadow step on a one-projection model,
worked out by hand; the checks ``bind`` makes on the method; the checkpoint round trip; two training steps of
conf/algorithm/coop_sft_rl.yaml on the tiny model with the mechanism metrics moving."""

from __future__ import annotations

import functools
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.group_stages.cooperative import BilevelTeacher, clip_factor, surrogate_sums, teacher_gradients
from rlexp.algorithms.group_stages.demonstrations import Demonstrations
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.off_policy import Chord
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
CLIP = functools.partial(ppo_clip, eps_low=0.2, eps_high=0.2)


def test_clip_factor_by_hand():
    # clip_grad_norm_ multiplies by min(1, c / (‖g‖ + 1e-6)): ‖g‖ = 4, c = 1 → 1 / 4.000001
    assert clip_factor(4.0, 1.0) == pytest.approx(1 / 4.000001, rel=1e-12)
    assert clip_factor(0.5, 1.0) == 1.0  # below the bound: untouched
    assert clip_factor(4.0, None) == 1.0 and clip_factor(4.0, 0.0) == 1.0  # no clip


def test_teacher_gradients_by_hand_and_by_autograd():
    # one projection, rank 1, s = 2, λ = 0.5; A = [1 2], B = [3; −1]
    a, b = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [-1.0]])
    g_joint = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    g_shadow = torch.tensor([[2.0, 2.0], [0.0, -2.0]])
    ga, gb = teacher_gradients(g_joint, g_shadow, a, b, lam=0.5, scale=2.0)
    # G_T = g_joint − 0.5·g_shadow = [[0, −1], [0, 2]]
    # ∇A = s·Bᵀ·G_T = 2·[3·0 − 1·0, 3·(−1) − 1·2] = [[0, −10]]
    # ∇B = s·G_T·Aᵀ = 2·[[0·1 − 1·2], [0·1 + 2·2]] = [[−4], [8]]
    torch.testing.assert_close(ga, torch.tensor([[0.0, -10.0]]))
    torch.testing.assert_close(gb, torch.tensor([[-4.0], [8.0]]))
    # the same by autograd: the joint loss is linear in W = θ + s·B·A with gradient g_joint, the shadow's in
    # Ŵ = θ̂ + s·B·A with gradient g_shadow; the teacher's loss is joint − λ·shadow
    A, B = a.clone().requires_grad_(), b.clone().requires_grad_()
    theta, theta_hat = torch.randn(2, 2), torch.randn(2, 2)
    loss = (g_joint * (theta + 2.0 * B @ A)).sum() - 0.5 * (g_shadow * (theta_hat + 2.0 * B @ A)).sum()
    loss.backward()
    torch.testing.assert_close(A.grad, ga)
    torch.testing.assert_close(B.grad, gb)


def test_surrogate_gain_by_hand():
    # two rollouts of one token each, ε = 0.2; the shadow's ratios r̂ = π_θ̂ / π_θ: 1.5 on A = +1, 0.9 on A = −1
    old = torch.log(torch.tensor([[0.2], [0.4]]))
    shadow = torch.log(torch.tensor([[0.3], [0.36]])).requires_grad_()
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 1)
    s, r = surrogate_sums(CLIP, shadow, old, adv, mask)
    # shadow: −min(1.5·1, 1.2·1) = −1.2 and −min(0.9·(−1), 0.9·(−1)) = +0.9 → Σ = −0.3; at ratio 1: −1 + 1 = 0
    assert float(s.detach()) == pytest.approx(-0.3) and float(r) == pytest.approx(0.0)
    # the gain J_RL(θ) − J_RL(θ̂) = L(θ̂) − L(θ) = (−0.3 − 0) / 2 tokens = −0.15: the shadow is ahead on these rollouts
    assert float(s.detach() - r) / 2 == pytest.approx(-0.15)
    s.backward()  # the clipped first token carries no gradient; the second −A·r̂ = 0.9 per unit of log π
    torch.testing.assert_close(shadow.grad, torch.tensor([[0.0], [0.9]]))
    # a masked token counts in neither sum
    s2, r2 = surrogate_sums(CLIP, shadow.detach(), old, adv, torch.tensor([[1.0], [0.0]]))
    assert float(s2) == pytest.approx(-1.2) and float(r2) == pytest.approx(-1.0)


class OneProjection(nn.Module):
    """A 'policy' with one adapted projection (q_proj, 2 → 2) and one other weight."""

    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(2, 2, bias=False)
        self.other = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.q_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
            self.other.weight.copy_(torch.tensor([[0.5, 0.5]]))


def bound_stage(**kw) -> BilevelTeacher:
    stage = BilevelTeacher(**kw)
    Algorithm(
        name="x",
        advantage=grpo,
        loss=Chord(CLIP, mu_peak=0.5, mu_valley=0.5, phi=False),
        group_stages=[Demonstrations(mode="separate"), stage],
    )
    return stage


def test_one_teacher_and_shadow_step_by_hand(monkeypatch):
    """λ = 0.5, rank 1, s = alpha / rank = 2, A set to [1 2], B = 0 (as built). The student's gradient on W is
    G_joint = I, left clipped by the trainer (‖g‖ = 4 → × 1/4); the shadow's is G_shadow = [[2, 2], [0, 2]]."""
    policy = OneProjection()
    stage = bound_stage(rank=1, alpha=2.0, target_modules=["q_proj"], teacher_lr=0.1, teacher_max_grad_norm=None)
    assert stage.lam == pytest.approx(0.5) and stage.inner is CLIP
    stage.build(policy, seed=0)
    assert [name for name, _, _ in stage.targets] == ["q_proj"]
    torch.testing.assert_close(stage.b[0].detach(), torch.zeros(2, 1))  # B = 0: the policy starts unchanged
    assert stage.a[0].abs().max() <= 1 / math.sqrt(2)  # LoRA's A: U(±1/√in)
    with torch.no_grad():
        stage.a[0].copy_(torch.tensor([[1.0, 2.0]]))
    w0, w_hat0 = policy.q_proj.weight.detach().clone(), stage.shadow.q_proj.weight.detach().clone()
    policy.q_proj.weight.grad = torch.eye(2) * clip_factor(4.0, 1.0)  # what the trainer's clip left

    def shadow_backward(batch, ctx):
        stage.shadow.q_proj.weight.grad = torch.tensor([[2.0, 2.0], [0.0, 2.0]])
        return {"coop/gain": 0.0}

    monkeypatch.setattr(stage, "_shadow_backward", shadow_backward)
    ctx = SimpleNamespace(policy=policy, settings=SimpleNamespace(max_grad_norm=1.0))
    stage._pending = (SimpleNamespace(extras={}), ctx)
    m = stage.after_update(1, {"grad_norm": 4.0, "lr": 0.01, "train/optimizer_steps": 1.0})
    # the clip undone: G_T = I − 0.5·[[2, 2], [0, 2]] = [[0, −1], [0, 0]]; ∇A = s·Bᵀ·G_T = 0 (B = 0);
    # ∇B = s·G_T·Aᵀ = 2·[[0·1 − 1·2], [0]] = [[−4], [0]] → ‖∇‖ = 4
    assert m["coop/teacher_grad_norm"] == pytest.approx(4.0, rel=1e-5)
    # cos(G_joint, G_shadow) = (2 + 2) / (√2 · √12)
    assert m["coop/grad_cos"] == pytest.approx(4 / math.sqrt(24), rel=1e-5)
    # Adam's first step moves a parameter by −lr·g/(|g| + ε) = −lr·sign(g): B' = [[0.1], [0]], A unchanged
    torch.testing.assert_close(stage.b[0].detach(), torch.tensor([[0.1], [0.0]]))
    torch.testing.assert_close(stage.a[0].detach(), torch.tensor([[1.0, 2.0]]))
    # Δw = s·B'·A − s·0 = 2·[[0.1], [0]]·[1 2] = [[0.2, 0.4], [0, 0]], added to the policy's W and the shadow's Ŵ
    delta = torch.tensor([[0.2, 0.4], [0.0, 0.0]])
    torch.testing.assert_close(policy.q_proj.weight.detach(), w0 + delta)
    # the shadow's AdamW (lr 0.01, the policy's) moved Ŵ by −0.01·sign(G_shadow) first (the clip keeps the signs)
    shadow_step = -0.01 * torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    torch.testing.assert_close(stage.shadow.q_proj.weight.detach(), w_hat0 + shadow_step + delta)
    # θ = W − s·B·A is untouched by the teacher: here the student did not step, so θ is still the initial W
    torch.testing.assert_close(policy.q_proj.weight.detach() - 2.0 * stage.b[0].detach() @ stage.a[0].detach(), w0)
    assert m["coop/lora_norm"] == pytest.approx(math.sqrt(0.2), rel=1e-5)  # ‖[[0.2, 0.4], [0, 0]]‖
    assert m["coop/teacher_step_norm"] == pytest.approx(math.sqrt(0.2), rel=1e-5)
    assert m["coop/drift"] == pytest.approx(0.01 * math.sqrt(3), rel=1e-4)  # ‖W − Ŵ‖: the shadow's own step
    assert m["coop/sft_weight"] == pytest.approx(0.5) and m["coop/shadow_grad_norm"] == pytest.approx(math.sqrt(12))
    assert stage.after_update(2, {}) == {}  # nothing pending: no step


def test_the_state_round_trips_through_a_checkpoint():
    policy = OneProjection()
    stage = bound_stage(rank=1, alpha=2.0, target_modules=["q_proj"])
    stage.build(policy, seed=3)
    with torch.no_grad():
        stage.b[0].fill_(0.25)
        stage.shadow.other.weight.fill_(-1.0)
    state = stage.state_dict()
    other = bound_stage(rank=1, alpha=2.0, target_modules=["q_proj"])
    assert other.state_dict() is None
    other.load_state_dict(state)  # kept until the stage is built from the policy
    other.build(OneProjection(), seed=0)
    torch.testing.assert_close(other.a[0], stage.a[0])
    torch.testing.assert_close(other.b[0].detach(), torch.full((2, 1), 0.25))
    torch.testing.assert_close(other.shadow.other.weight.detach(), torch.full((1, 2), -1.0))
    wrong = bound_stage(rank=1, alpha=2.0, target_modules=["other"])
    wrong.load_state_dict(state)
    with pytest.raises(RuntimeError, match="adapted projections differ"):
        wrong.build(OneProjection())


def test_settings_and_the_method_are_checked():
    with pytest.raises(ValueError, match="rank=0"):
        BilevelTeacher(rank=0)
    with pytest.raises(ValueError, match="teacher_lr=0"):
        BilevelTeacher(teacher_lr=0)
    with pytest.raises(ValueError, match="target_modules"):
        BilevelTeacher(target_modules="q_proj")
    with pytest.raises(ValueError, match="names no nn.Linear"):
        bound_stage(target_modules=["w_q"]).build(OneProjection())
    demos = Demonstrations(mode="separate")
    chord = Chord(CLIP, mu_peak=0.5, mu_valley=0.5, phi=False)
    with pytest.raises(ValueError, match="constant SFT weight"):  # CHORD's decaying μ
        Algorithm(name="x", advantage=grpo, loss=Chord(CLIP), group_stages=[demos, BilevelTeacher()])
    with pytest.raises(ValueError, match="needs algorithm.loss"):
        Algorithm(name="x", advantage=grpo, loss=CLIP, group_stages=[demos, BilevelTeacher()])
    with pytest.raises(ValueError, match="after the Demonstrations stage"):
        Algorithm(name="x", advantage=grpo, loss=chord, group_stages=[BilevelTeacher(), demos])
    with pytest.raises(ValueError, match="steps_per_rollout"):
        Algorithm(name="x", advantage=grpo, loss=chord, group_stages=[demos, BilevelTeacher()], steps_per_rollout=2)
    with pytest.raises(ValueError, match="kl.coef"):
        Algorithm(name="x", advantage=grpo, loss=chord, group_stages=[demos, BilevelTeacher()], kl={"coef": 0.1})
    stage = BilevelTeacher()
    with pytest.raises(ValueError, match="trainer.async_rollout"):
        bound_stage()(None, SimpleNamespace(settings=SimpleNamespace(async_rollout=True)))
    with pytest.raises(RuntimeError, match="not bound"):
        stage(None, SimpleNamespace(settings=None))


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_coop_sft_rl_trains_two_steps_and_its_mechanism_acts(tiny_cfg, tmp_path):
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=coop_sft_rl"))
    assert result.last_step == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first, second = rows[0], rows[1]
    for row in rows:
        assert row["demo/rows"] == 1 and row["chord/mu"] == pytest.approx(0.5)  # ⌈0.25 × 2 prompts⌉ expert rows
        assert row["coop/sft_weight"] == pytest.approx(0.5) and row["chord/sft_loss"] > 0
        assert math.isfinite(row["coop/gain"]) and row["coop/teacher_grad_norm"] > 0
    # step 1: the shadow is the policy (θ̂ = θ, w = 0); after it the teacher's adapter and the two trajectories part
    assert first["coop/lora_norm"] > 0 and first["coop/teacher_step_norm"] > 0 and first["coop/drift"] > 0
    # step 2: the joint policy and the RL-only shadow differ on the shared rollouts: a non-zero cooperative gain
    assert second["coop/lora_norm"] != first["coop/lora_norm"] and second["coop/drift"] > 0
    assert second["coop/gain"] != 0.0 and second["coop/shadow_ratio_mean"] != 1.0
