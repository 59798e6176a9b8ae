"""RL-PLUS's multiple importance sampling and exploration-based advantage (rlexp/algorithms/losses/off_policy.py,
MultipleImportanceSampling): the ratio, the weight, the loss and its gradient worked out by hand; the wiring through
``Algorithm`` (the old policy's forward the trainer must run); two-step tiny runs of conf/algorithm/rl_plus.yaml."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.group_stages.demonstrations import Demonstrations, part_weights
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.off_policy import (
    MultipleImportanceSampling,
    PolicyShaping,
    exploration_weight,
    mis_ratio,
)
from rlexp.core.masks import DEMO_PART_WEIGHT, DEMONSTRATION, PRECEDENT
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
CLIP = functools.partial(ppo_clip, eps_low=0.2, eps_high=0.2)


def token_mean(stat: torch.Tensor, mask: torch.Tensor) -> float:
    """A token statistic as the trainer reports it: Σ stat·m over all loss tokens / their count."""
    return float((stat * mask).sum() / mask.sum())


def test_mis_ratio_by_hand():
    p = torch.tensor([0.5, 0.5, 0.5])
    old = torch.log(torch.tensor([0.2, 1 / 3, 1.0]))
    # α = w = ½ (RL-PLUS): π / (½·π_old + ½·½(π_old + 1)) = π / (¾·π_old + ¼): 0.5/0.4, 0.5/0.5, 0.5/1
    torch.testing.assert_close(mis_ratio(torch.log(p), old, 0.5, 0.5), torch.tensor([1.25, 1.0, 0.5]))
    # α = 1: plain importance sampling against π_old: 0.5/0.2, 0.5/(1/3), 0.5/1
    torch.testing.assert_close(mis_ratio(torch.log(p), old, 1.0, 0.5), torch.tensor([2.5, 1.5, 0.5]))
    # α = 0, w = 0: the expert is a point mass (π_ω = 1, LUFFY's π_φ): the ratio is π itself
    torch.testing.assert_close(mis_ratio(torch.log(p), old, 0.0, 0.0), p)
    # bounded by 1/¼ = 4 at α = w = ½, whatever π_old
    assert float(mis_ratio(torch.tensor(0.0), torch.tensor(-50.0), 0.5, 0.5)) == pytest.approx(4.0)


def test_exploration_weight_by_hand():
    # (1 − p)^½: p = 0.75 → 0.5, p = 0.19 → 0.9, p = 1 → 0; γ = 0: 1 everywhere
    p = torch.tensor([0.75, 0.19, 1.0])
    torch.testing.assert_close(exploration_weight(p, 0.5), torch.tensor([0.5, 0.9, 0.0]))
    torch.testing.assert_close(exploration_weight(p, 0.0), torch.ones(3))
    torch.testing.assert_close(exploration_weight(p, 2.0), torch.tensor([0.0625, 0.6561, 0.0]))


def case():
    """Row 0 a rollout (on-policy: ratio 1, A = +1); row 1 a demonstration with π_θ = [0.75, 0.19],
    π_old = [0.2, 1/3] (precedent log-probs; its own old log-probs are its sampling log-probs 0), A = +2."""
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.75, 0.19]])).requires_grad_(True)
    old = torch.cat([logp[:1].detach(), torch.zeros(1, 2)])
    precedent = torch.cat([logp[:1].detach(), torch.log(torch.tensor([[0.2, 1 / 3]]))])
    adv = torch.tensor([1.0, 2.0])
    mask = torch.ones(2, 2)
    demo = torch.tensor([False, True])
    return logp, old, precedent, adv, mask, demo


def test_demonstration_tokens_take_the_mis_ratio_times_the_exploration_advantage_by_hand():
    """Demonstration tokens: r = π / (¾·π_old + ¼) = [0.75/0.4, 0.19/0.5] = [1.875, 0.38]; C = (1 − π)^½ = [0.5, 0.9];
    loss −r·A·C = −[1.875·2·0.5, 0.38·2·0.9] = [−1.875, −0.684]; ∂/∂log π = −A·C·r (C detached): the same values.
    The rollout row: the clipped surrogate at ratio 1, −A = −1 per token, gradient −1."""
    logp, old, precedent, adv, mask, demo = case()
    w = part_weights(mask, demo)  # 4 tokens, 2 each part: [2, 2]
    loss = MultipleImportanceSampling(CLIP, alpha=0.5, expert_old_weight=0.5, gamma=0.5)
    out = loss(logp, old, adv, mask, demonstration=demo, demo_part_weight=w, precedent_logprobs=precedent)
    torch.testing.assert_close(out.per_token, torch.tensor([[-1.0, -1.0], [-1.875, -0.684]]))
    out.per_token.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -1.0], [-1.875, -0.684]]))
    s = out.token_stats  # means over the demonstration tokens (the weights make the trainer's /4 a /2)
    assert token_mean(s["rlplus/mis_ratio_mean"], mask) == pytest.approx((1.875 + 0.38) / 2)
    assert token_mean(s["rlplus/exploration_weight_mean"], mask) == pytest.approx((0.5 + 0.9) / 2)
    assert token_mean(s["rlplus/prob_mean"], mask) == pytest.approx((0.75 + 0.19) / 2)
    assert token_mean(s["rlplus/old_prob_mean"], mask) == pytest.approx((0.2 + 1 / 3) / 2)
    assert token_mean(s["rlplus/demo_token_frac"], mask) == 0.5
    # the inner loss's statistics cover the rollouts only (r = 1.875 > 1.2 on a demonstration is not "clipped high")
    assert s["clip/high_frac"].sum() == 0 and s["ratio/mean"][1].tolist() == [1.0, 1.0]


def test_without_exploration_and_with_a_point_mass_expert_it_is_plain_importance_weighting():
    """γ = 0, α = w = 0: −A·π on the demonstration tokens, the unshaped weight LUFFY's f(p) = p/(p + γ) replaces."""
    logp, old, precedent, adv, mask, demo = case()
    out = MultipleImportanceSampling(CLIP, alpha=0.0, expert_old_weight=0.0, gamma=0.0)(
        logp, old, adv, mask, demonstration=demo, demo_part_weight=torch.ones(2), precedent_logprobs=precedent
    )
    torch.testing.assert_close(out.per_token[1], -2.0 * torch.tensor([0.75, 0.19]))
    shaped = PolicyShaping(CLIP, gamma=1e-9)(logp, old, adv, mask, demonstration=demo, demo_part_weight=torch.ones(2))
    torch.testing.assert_close(out.per_token[1], shaped.per_token[1] * torch.tensor([0.75, 0.19]), atol=1e-6, rtol=0)


def test_without_demonstrations_it_is_the_inner_loss():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    old = logp - 0.3
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    out = MultipleImportanceSampling(ppo_clip)(
        logp,
        old,
        adv,
        mask,
        demonstration=torch.zeros(2, dtype=torch.bool),
        demo_part_weight=torch.ones(2),
        precedent_logprobs=old,
    )
    torch.testing.assert_close(out.per_token, ppo_clip(logp, old, adv, mask).per_token)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": 1.5}, "alpha=1.5"),
        ({"expert_old_weight": -0.1}, "expert_old_weight=-0.1"),
        ({"gamma": -1.0}, "gamma=-1.0"),
    ],
)
def test_bad_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultipleImportanceSampling(ppo_clip, **kwargs)


def test_refuses_an_inner_that_is_no_loss_and_a_batch_without_the_old_log_probs():
    with pytest.raises(ValueError, match="inner must be a policy loss"):
        MultipleImportanceSampling(None)
    logp, old, _, adv, mask, demo = case()
    with pytest.raises(ValueError, match="precedent_logprobs"):
        MultipleImportanceSampling(ppo_clip)(logp, old, adv, mask, demonstration=demo, demo_part_weight=torch.ones(2))


# ---------------------------------------------------------------- wiring through Algorithm


def test_algorithm_hands_the_loss_the_old_log_probs_and_asks_the_trainer_for_them():
    algo = Algorithm(name="x", advantage=grpo, loss=MultipleImportanceSampling(CLIP), group_stages=[Demonstrations()])
    assert set(algo.token_loss_extras) == {DEMONSTRATION, DEMO_PART_WEIGHT, PRECEDENT}
    assert algo.loss_needs_old_forward  # the trainer recomputes π_old even for one optimiser step
    assert not Algorithm(name="g", advantage=grpo, loss=ppo_clip).loss_needs_old_forward  # GRPO: unchanged
    logp, old, precedent, adv, mask, demo = case()
    extras = {DEMONSTRATION: demo, DEMO_PART_WEIGHT: torch.tensor([2.0, 2.0]), PRECEDENT: precedent}
    out = algo.token_loss(logp, old, adv, mask, extras=extras)
    torch.testing.assert_close(out.per_token, torch.tensor([[-1.0, -1.0], [-1.875, -0.684]]))
    with pytest.raises(ValueError, match="no stage in algorithm.group_stages sets"):
        Algorithm(name="x", advantage=grpo, loss=MultipleImportanceSampling(CLIP), group_stages=[])


# ---------------------------------------------------------------- two training steps on the tiny model


def _check_rl_plus(m: dict, optimizer_steps: int) -> None:
    assert m["demo/rows"] == 2 and m["demo/replaced"] == 2 and m["train/optimizer_steps"] == optimizer_steps
    # π_old of the demonstration tokens is the policy's (≈ 1/49152 for the random model), not the placeholder 1 that
    # their sampling log-probs (0) would give: the MIS ratio ≈ π_θ / ¼, the exploration weight ≈ 1
    assert 0 < m["rlplus/old_prob_mean"] < 1e-3 and 0 < m["rlplus/prob_mean"] < 1e-3
    assert m["rlplus/mis_ratio_mean"] == pytest.approx(4 * m["rlplus/prob_mean"], rel=0.05)
    assert 0.99 < m["rlplus/exploration_weight_mean"] <= 1.0 and m["rlplus/demo_token_frac"] > 0
    assert m["advantage/abs_mean"] > 0 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])


@pytest.mark.long  # two optimiser steps per rollout and the entropy bonus's gradient, as LUFFY's run
def test_rl_plus_trains_two_steps_with_a_demonstration_in_each_group(tiny_cfg):
    _check_rl_plus(run(tiny_cfg(*VARYING, *FAST, "algorithm=rl_plus")).metrics, 2)


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_rl_plus_gets_the_old_policy_of_the_demonstrations_with_one_optimiser_step(tiny_cfg):
    """One optimiser step per rollout is on-policy (no old-log-prob forward for GRPO); the MIS loss asks for one."""
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=rl_plus", "algorithm.steps_per_rollout=1")).metrics
    _check_rl_plus(m, 1)
