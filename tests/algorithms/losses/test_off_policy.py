"""LUFFY's policy shaping and CHORD's μ-weighted SFT term (rlexp/algorithms/losses/off_policy.py): values, gradients,
per-part token means and the μ schedule worked out by hand; the wiring through ``Algorithm``; a two-step tiny run of
each method (conf/algorithm/luffy.yaml, chord.yaml) with its mechanism metrics."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.group_stages.demonstrations import Demonstrations, part_weights
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.off_policy import Chord, PolicyShaping, mu_schedule, shaping
from rlexp.core.masks import DEMO_PART_WEIGHT, DEMONSTRATION
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


def token_mean(stat: torch.Tensor, mask: torch.Tensor) -> float:
    """A token statistic as the trainer reports it: Σ stat·m over all loss tokens / their count."""
    return float((stat * mask).sum() / mask.sum())


# ---------------------------------------------------------------- LUFFY


def test_shaping_values():
    # f(p) = p / (p + 0.1): 0.1 / 0.2 = 0.5, 0.9 / 1.0 = 0.9, 0.01 / 0.11 = 1/11
    f = shaping(torch.tensor([0.1, 0.9, 0.01]), 0.1)
    torch.testing.assert_close(f, torch.tensor([0.5, 0.9, 1 / 11]))


def test_policy_shaping_on_demonstration_rows_by_hand():
    """Row 0 a rollout (on-policy: ratio 1, A = +1): the clipped surrogate, −A·r = −1 per token, gradient −1.
    Row 1 a demonstration, π_φ = 1 (old log-probs 0), p = π_θ = [0.1, 0.9], A = −2:
    loss −A·f(p) = 2·[0.5, 0.9] = [1.0, 1.8]; ∂/∂log p = −A·γ·p/(p + γ)² = 2·[0.1·0.1/0.04, 0.9·0.1/1] = [0.5, 0.18].
    No clip: ppo_clip would take min(r·A, clip(r, 0.8, 1.2)·A) = 0.8·(−2) on p = 0.1."""
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]])).requires_grad_(True)
    old = torch.cat([logp[:1].detach(), torch.zeros(1, 2)])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.ones(2, 2)
    demo = torch.tensor([False, True])
    w = part_weights(mask, demo)  # 4 tokens, 2 each part: [2, 2]
    loss = PolicyShaping(functools.partial(ppo_clip, eps_low=0.2, eps_high=0.2), gamma=0.1)
    out = loss(logp, old, adv, mask, demonstration=demo, demo_part_weight=w)
    torch.testing.assert_close(out.per_token, torch.tensor([[-1.0, -1.0], [1.0, 1.8]]))
    out.per_token.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -1.0], [0.5, 0.18]]))
    # the gradient of −A·f(π) w.r.t. log π is −A·p·γ/(p + γ)², at any p
    for p in (0.001, 0.3, 0.99):
        lp = torch.tensor(math.log(p), requires_grad=True)
        (2.0 * shaping(torch.exp(lp), 0.1)).backward()  # −A·f with A = −2
        assert lp.grad.item() == pytest.approx(2.0 * p * 0.1 / (p + 0.1) ** 2, rel=1e-5)
    # metrics: means over the demonstration tokens (the trainer divides by all 4 tokens; the weights make it 2)
    s = out.token_stats
    assert token_mean(s["luffy/shaped_weight_mean"], mask) == pytest.approx((0.25 + 0.09) / 2)
    assert token_mean(s["luffy/f_mean"], mask) == pytest.approx((0.5 + 0.9) / 2)
    assert token_mean(s["luffy/prob_mean"], mask) == pytest.approx(0.5)
    assert token_mean(s["luffy/demo_token_frac"], mask) == 0.5
    # the inner loss's statistics cover the rollouts only: the demonstration's p = 0.1 (A < 0) is not "clipped low"
    assert s["clip/low_frac"].sum() == 0 and s["ratio/mean"][1].tolist() == [1.0, 1.0]


def test_policy_shaping_without_demonstrations_is_the_inner_loss():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    old = logp - 0.3  # ratio e^0.3 > 1.2: clipped for A > 0
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 2)
    none = torch.zeros(2, dtype=torch.bool)
    out = PolicyShaping(ppo_clip)(logp, old, adv, mask, demonstration=none, demo_part_weight=torch.ones(2))
    torch.testing.assert_close(out.per_token, ppo_clip(logp, old, adv, mask).per_token)


# ---------------------------------------------------------------- CHORD


def chord_case():
    """Rows 0, 1 rollouts (2 and 1 loss tokens; A = +1, −0.5; on-policy, ratio 1); row 2 an expert row, p = [0.5, 0.2].
    N = 5 loss tokens, N_RL = 3, N_SFT = 2: weights 5/3 and 5/2."""
    p = torch.tensor([[0.5, 0.4], [0.3, 0.7], [0.5, 0.2]])
    logp = torch.log(p).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    demo = torch.tensor([False, False, True])
    adv = torch.tensor([1.0, -0.5, 0.0])
    w = part_weights(mask, demo)
    torch.testing.assert_close(w, torch.tensor([5 / 3, 5 / 3, 5 / 2]))
    return logp, mask, demo, adv, w


def test_chord_is_mu_weighted_per_part_token_means_by_hand():
    """mean_RL = (−1 − 1 + 0.5) / 3 = −0.5; expert φ = p(1 − p) = [0.25, 0.16], −φ·log p = [0.25·0.693147,
    0.16·1.609438] = [0.173287, 0.257510], mean_SFT = 0.215398; μ = 0.9: L = 0.1·(−0.5) + 0.9·0.215398 = 0.143859.
    Gradients: expert tokens −μ·φ / N_SFT = [−0.1125, −0.072]; rollout tokens −(1 − μ)·A / N_RL = [−1/30, −1/30],
    [+1/60]."""
    logp, mask, demo, adv, w = chord_case()
    loss = Chord(ppo_clip, mu_peak=0.9, mu_valley=0.05, mu_decay_steps=10)
    loss.on_step(1, 10)
    assert loss.mu == pytest.approx(0.9)
    out = loss(logp, logp.detach(), adv, mask, demonstration=demo, demo_part_weight=w)
    total = aggregate(out.per_token, mask, "token-mean", Normaliser.from_mask(mask))
    assert total.item() == pytest.approx(0.1 * -0.5 + 0.9 * 0.215398, abs=1e-6)
    total.backward()
    expected = torch.tensor([[-1 / 30, -1 / 30], [1 / 60, 0.0], [-0.1125, -0.072]])
    torch.testing.assert_close(logp.grad, expected)
    s = out.token_stats
    assert token_mean(s["chord/mu"], mask) == pytest.approx(0.9)
    assert token_mean(s["chord/sft_loss"], mask) == pytest.approx(0.215398, abs=1e-6)
    assert token_mean(s["chord/phi_mean"], mask) == pytest.approx((0.25 + 0.16) / 2)
    assert token_mean(s["chord/expert_token_frac"], mask) == pytest.approx(2 / 5)


def test_chord_mu_variant_is_plain_nll():
    """φ = 1: mean_SFT = (0.693147 + 1.609438) / 2 = 1.151293; L = −0.05 + 0.9·1.151293 = 0.986164; expert gradients
    −μ / N_SFT = −0.45."""
    logp, mask, demo, adv, w = chord_case()
    out = Chord(ppo_clip, mu_peak=0.9, mu_decay_steps=10, phi=False)(
        logp, logp.detach(), adv, mask, demonstration=demo, demo_part_weight=w
    )
    total = aggregate(out.per_token, mask, "token-mean", Normaliser.from_mask(mask))
    assert total.item() == pytest.approx(0.986164, abs=1e-6)
    total.backward()
    torch.testing.assert_close(logp.grad[2], torch.tensor([-0.45, -0.45]))


def test_chord_parts_do_not_depend_on_their_token_shares():
    """Each part is its own token mean: a longer expert row (4 equal tokens instead of 2) leaves L unchanged."""
    p_rl, p_exp = 0.5, 0.4
    for width in (2, 4):
        logp = torch.log(torch.tensor([[p_rl] * width, [p_exp] * width]))
        mask = torch.tensor([[1.0, 1.0] + [0.0] * (width - 2), [1.0] * width])
        demo = torch.tensor([False, True])
        out = Chord(ppo_clip, mu_peak=0.3, mu_valley=0.3)(
            logp, logp, torch.tensor([1.0, 0.0]), mask, demonstration=demo, demo_part_weight=part_weights(mask, demo)
        )
        total = aggregate(out.per_token, mask, "token-mean", Normaliser.from_mask(mask))
        sft = -p_exp * (1 - p_exp) * math.log(p_exp)
        assert total.item() == pytest.approx(0.7 * -1.0 + 0.3 * sft, abs=1e-6)


def test_mu_schedule_by_hand():
    # the released example: warm-up 200, decay 400, peak 0.5, valley 0.02
    sched = functools.partial(mu_schedule, warmup_steps=200, decay_steps=400, peak=0.5, valley=0.02)
    assert sched(0) == 0.0 and sched(100) == pytest.approx(0.25) and sched(200) == pytest.approx(0.5)
    assert sched(400) == pytest.approx(0.48 * 0.5 + 0.02)  # halfway through the decay: cos(π/2) = 0
    assert sched(600) == 0.02 and sched(1000) == 0.02
    # CHORD-μ: no warm-up, 0.9 → 0.05 over 200 steps; at 50: 0.85·(1 + cos(π/4))/2 + 0.05 = 0.775520
    sched = functools.partial(mu_schedule, warmup_steps=0, decay_steps=200, peak=0.9, valley=0.05)
    assert sched(0) == pytest.approx(0.9) and sched(50) == pytest.approx(0.775520, abs=1e-6)
    assert sched(100) == pytest.approx(0.475) and sched(200) == 0.05
    # the loss takes μ of the 0-based step; chord.yaml decays over trainer.max_steps (2 in the tiny runs)
    loss = Chord(ppo_clip, mu_peak=0.9, mu_valley=0.05, mu_decay_steps=2)
    loss.on_step(2, 2)
    assert loss.mu == pytest.approx(0.475)
    assert Chord(ppo_clip, mu_peak=0.1, mu_valley=0.1).mu == pytest.approx(0.1)  # CHORD-φ's constant μ


def test_settings_are_checked():
    with pytest.raises(ValueError, match="gamma=0"):
        PolicyShaping(ppo_clip, gamma=0)
    with pytest.raises(ValueError, match="mu_peak=1.5"):
        Chord(ppo_clip, mu_peak=1.5)
    with pytest.raises(ValueError, match="mu_decay_steps=-1"):
        Chord(ppo_clip, mu_decay_steps=-1)


# ---------------------------------------------------------------- wiring through Algorithm


def test_algorithm_refuses_chord_without_token_mean_or_the_stage():
    stage = Demonstrations(mode="separate")
    with pytest.raises(ValueError, match="needs algorithm.aggregation=token-mean"):
        Algorithm(
            name="x", advantage=grpo, loss=Chord(ppo_clip), aggregation="seq-mean-token-mean", group_stages=[stage]
        )
    with pytest.raises(ValueError, match="no stage in algorithm.group_stages sets"):
        Algorithm(name="x", advantage=grpo, loss=PolicyShaping(ppo_clip), group_stages=[])


def test_algorithm_passes_the_demonstration_extras_to_the_loss():
    algo = Algorithm(name="x", advantage=grpo, loss=PolicyShaping(ppo_clip), group_stages=[Demonstrations()])
    assert set(algo.token_loss_extras) == {DEMONSTRATION, DEMO_PART_WEIGHT}
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    old = torch.cat([logp[:1], torch.zeros(1, 2)])
    mask, adv = torch.ones(2, 2), torch.tensor([1.0, -2.0])
    extras = {DEMONSTRATION: torch.tensor([False, True]), DEMO_PART_WEIGHT: torch.tensor([2.0, 2.0])}
    out = algo.token_loss(logp, old, adv, mask, extras=extras)
    torch.testing.assert_close(out.per_token, torch.tensor([[-1.0, -1.0], [1.0, 1.8]]))


# ---------------------------------------------------------------- two training steps on the tiny model


@pytest.mark.long  # 12-19 s on the shared 2-core CPU (two optimiser steps, the entropy bonus's gradient)
def test_luffy_trains_two_steps_with_a_demonstration_in_each_group(tiny_cfg):
    """The default reward: the tiny model's rollouts score 0, its demonstrations 1 + 0.2 (accuracy, format), so the
    mixed groups have a spread (advantage ≠ 0) only thanks to the demonstration. π_φ = 1: the shaped ratio is π_θ
    itself (≈ 1/49152 for the random model), not ~1 as against a recomputed old policy."""
    m = run(tiny_cfg(*FAST, "algorithm=luffy")).metrics
    assert m["demo/rows"] == 2 and m["demo/replaced"] == 2 and m["demo/missing"] == 0
    assert m["demo/reward_mean"] == pytest.approx(1.2)
    assert m["advantage/abs_mean"] > 0 and m["train/optimizer_steps"] == 2
    assert 0 < m["luffy/prob_mean"] < 1e-3 and m["luffy/shaped_weight_mean"] > 0 and m["luffy/f_mean"] > 0
    assert m["batch/replayed_completions"] == 2 and math.isfinite(m["loss/total"])


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_chord_trains_two_steps_with_an_expert_row(tiny_cfg):
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=chord")).metrics
    assert m["demo/rows"] == 1 and m["demo/replaced"] == 0  # ⌈0.25 × 2 prompts⌉
    assert m["chord/mu"] == pytest.approx(0.475)  # the second of 2 steps: halfway down the cosine
    assert m["chord/sft_loss"] > 0 and m["chord/phi_mean"] > 0 and m["chord/expert_token_frac"] > 0
    assert m["advantage/abs_mean"] > 0 and math.isfinite(m["loss/total"])
