"""EPO's entropy term (rlexp/algorithms/regularisers/entropy.py ``EntropySmoothing``; conf/algorithm/epo.yaml): the
corridor penalty, β_k and the historical target by hand, the term inside ``Algorithm.token_loss``, and two training
steps in multi-turn episodes with the Python tool (long)."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.regularisers.entropy import EntropySmoothing
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING


def test_the_corridor_penalty_by_hand():
    term = EntropySmoothing(kappa_low=0.5, kappa_high=1.5)
    h = torch.tensor([[0.2, 0.5, 1.0, 1.5, 2.3]])
    # H̄ = 1.0: the corridor [0.5, 1.5]; P = [0.5 − H]₊ + [H − 1.5]₊ = 0.3, 0, 0, 0, 0.8
    assert torch.allclose(term.penalty(h, 1.0), torch.tensor([[0.3, 0.0, 0.0, 0.0, 0.8]]))
    # the paper's corridor κ_l = 0, κ_r = 2 around H̄ = 0.5: only entropy above 1.0 is penalised
    paper = EntropySmoothing()
    assert torch.allclose(paper.penalty(h, 0.5), torch.tensor([[0.0, 0.0, 0.0, 0.5, 1.3]]))


def test_beta_k_and_the_cumulative_target():
    term = EntropySmoothing(gamma=3.0, total_steps=10)  # k_mid = 5
    assert term.target() is None and term.beta() == pytest.approx(2.0)  # k = 0: 1 + e^0
    m = term.update(step=1, metrics={"epo/entropy": 0.6})
    assert m == {"epo/entropy_target": 0.0, "epo/beta": 0.0, "epo/next_entropy_target": 0.6}  # no penalty at step 0
    assert term.beta() == pytest.approx(1 + math.exp(-3 / 5))  # k = 1: 1.5488
    term.update(step=2, metrics={"epo/entropy": 0.2})
    assert term.target() == pytest.approx(0.4)  # the mean of 0.6 and 0.2 (the whole history, not a window)
    m = term.update(step=3, metrics={"epo/entropy": float("nan")})  # a step without tokens: nothing appended
    assert m["epo/entropy_target"] == pytest.approx(0.4) and m["epo/beta"] == pytest.approx(1 + math.exp(-6 / 5))
    assert len(term.history) == 2
    assert EntropySmoothing(dynamic_weight=False).beta() == 1.0  # the paper's "W/O DW"
    again = EntropySmoothing()
    again.load_state_dict(term.state_dict())
    assert again.history == [0.6, 0.2] and again.step_index == 2


def test_the_token_term_and_its_gradient_by_hand():
    term = EntropySmoothing(coef=0.5, alpha=0.1, kappa_low=0.5, kappa_high=1.5, gamma=3.0, total_steps=2)
    mask = torch.ones(1, 3)
    h0 = torch.tensor([[0.2, 1.0, 2.3]], requires_grad=True)
    first, stats = term.token_term(h0, mask)  # step 0: the bonus only, −λ·H
    assert torch.allclose(first, torch.tensor([[-0.1, -0.5, -1.15]]))
    assert stats["epo/smoothing_penalty"].sum() == 0 and stats["epo/out_of_band_frac"].sum() == 0
    term.update(step=1, metrics={"epo/entropy": 1.0})  # H̄_W = 1.0, k = 1, k_mid = 1: β = 1 + e^−3 = 1.049787
    beta = 1 + math.exp(-3.0)
    h = torch.tensor([[0.2, 1.0, 2.3]], requires_grad=True)
    out, stats = term.token_term(h, mask)
    # α·P = 0.1·(0.3, 0, 0.8); per token λ·(−H + β·α·P)
    want = 0.5 * (-h.detach() + beta * torch.tensor([[0.03, 0.0, 0.08]]))
    assert torch.allclose(out, want, atol=1e-6)
    assert torch.allclose(stats["epo/smoothing_penalty"], torch.tensor([[0.03, 0.0, 0.08]]))
    assert stats["epo/out_of_band_frac"].tolist() == [[1.0, 0.0, 1.0]]
    out.sum().backward()
    # ∂/∂H: λ·(−1 − β·α) under the corridor (pushes H up more), −λ inside, λ·(−1 + β·α) above (less bonus)
    grad = [0.5 * (-1 - beta * 0.1), -0.5, 0.5 * (-1 + beta * 0.1)]
    assert h.grad[0].tolist() == pytest.approx(grad)


def test_inside_token_loss_and_bad_settings():
    term = EntropySmoothing(coef=0.5)
    algo = Algorithm(name="epo", advantage=grpo, loss=ppo_clip, entropy_control=term)
    assert algo.entropy_grad and algo.entropy_clamp == 0.0  # the full-vocabulary entropy, with gradient
    logp, mask, adv = torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([1.0])
    h = torch.tensor([[0.4, 0.8]])
    plain = Algorithm(name="x", advantage=grpo, loss=ppo_clip).token_loss(logp, logp, adv, mask)
    out = algo.token_loss(logp, logp, adv, mask, entropy=h)
    assert torch.allclose(out.per_token, plain.per_token - 0.5 * h) and "epo/entropy" in out.token_stats
    for kw, key in (({"alpha": -1}, "alpha"), ({"kappa_low": 3.0}, "kappa_low"), ({"total_steps": 0}, "total_steps")):
        with pytest.raises(ValueError, match=key):
            EntropySmoothing(**kw)


# multi-turn episodes with a scripted first call (not prompt=python_tool: its worked examples hold a tool message,
# which FirstCallEngine takes for a later turn, so it would never script the call)
MULTI_TURN = [
    "rollout=multi_turn",
    "environment=tool_use",
    "tools=[python]",
    "rollout.engine._target_=tests.rollout.first_call_engine.FirstCallEngine",
    "trainer.max_new_tokens=80",
    "rollout.max_turn_tokens=12",
    "rollout.max_turns=3",
]
# the tiny random model's token entropies are all within a few thousandths of ln|V| (10.78), so the paper's corridor
# [0, 2·H̄] holds every token; the corridor shrunk to H̄ itself (κ_l = κ_r = 1: P = |H − H̄|) puts them outside it at
# the second step, so the penalty's mechanism shows
EPO_TINY = ["algorithm.entropy_control.kappa_low=1.0", "algorithm.entropy_control.kappa_high=1.0"]


@pytest.mark.long  # ~15 s quiet: two steps of four multi-turn episodes with the sandboxed tool
def test_epo_trains_two_steps_in_multi_turn_episodes(tiny_cfg):
    result = run(tiny_cfg("algorithm=epo", *MULTI_TURN, *VARYING, *EPO_TINY, "trainer.autocast=off"))
    m = result.metrics  # the last (second) step's
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["episode/tool_calls"] >= 1.0 and m["episode/turns"] >= 2.0
    assert m["epo/entropy_target"] > 0.0  # the first step's entropy is the corridor's centre
    assert m["epo/beta"] == pytest.approx(1 + math.exp(-3.0))  # K = 2: k = 1, k_mid = 1
    assert m["epo/smoothing_penalty"] > 0.0 and 0.0 < m["epo/out_of_band_frac"] <= 1.0
    assert m["epo/entropy"] > 0.0
