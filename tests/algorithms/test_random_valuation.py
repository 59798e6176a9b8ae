"""ROVER (arXiv 2509.24981): the uniform valuation of the next state, the target and the loss, by hand."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.random_valuation import Rover, next_state_values
from rlexp.core.forward import completion_logits, token_logprobs, vocab_mean_logprobs
from rlexp.core.masks import OLD_MEAN_LOGPROBS
from rlexp.runs.training import run
from rlexp.trainer.optimize import batch_logprobs, policy_update
from tests.algorithms.batches import tiny_policy, token_batch
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


def test_vocab_mean_of_a_three_token_vocabulary_by_hand():
    # logits (ln 2, 0, 0): π = (1/2, 1/4, 1/4); mean_v log π = (ln ½ + 2 ln ¼)/3 = ln(1/32)/3 = −1.155245
    # logits (0, 0, 0): uniform, mean log π = −ln 3 = −1.098612
    logits = torch.tensor([[[math.log(2.0), 0.0, 0.0], [0.0, 0.0, 0.0]]])
    out = vocab_mean_logprobs(logits)
    assert out[0].tolist() == pytest.approx([math.log(1 / 32) / 3, -math.log(3)], abs=1e-6)
    # at temperature 2 the first is softmax(ln2/2, 0, 0) = (√2, 1, 1)/(2 + √2): mean = ln(√2)/3 − ln(2 + √2)
    hot = vocab_mean_logprobs(logits, temperature=2.0, chunk_elements=3)  # one row per chunk
    assert hot[0, 0].item() == pytest.approx(math.log(math.sqrt(2)) / 3 - math.log(2 + math.sqrt(2)), abs=1e-6)


def test_the_forward_returns_the_vocabulary_mean_beside_the_log_probs():
    model, b = tiny_policy(), token_batch()
    args = (model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    for share in (False, True):
        lp, _, extra = token_logprobs(*args, temperature=0.7, vocab_mean=True, share_prompts=share)
        with torch.no_grad():
            want = torch.log_softmax(completion_logits(*args).float() / 0.7, -1).mean(-1)
        assert torch.allclose(extra["mean_logp"], want, atol=1e-5)
        assert not extra["mean_logp"].requires_grad and lp.requires_grad
    with pytest.raises(ValueError, match="action mask"):
        token_logprobs(*args, vocab_mean=True, vocab_mask=torch.ones(4, 4, 32, dtype=torch.bool))


def test_rover_target_and_loss_on_a_three_token_vocabulary_by_hand():
    # one completion of two tokens (a third, padded column); the old policy is uniform over 3 tokens at every
    # position, the current one is (1/2, 1/4, 1/4) at both positions; the tokens are a_0 = 0 (p ½), a_1 = 1 (p ¼)
    uniform = -math.log(3)
    cur_mean = math.log(1 / 32) / 3  # −1.155245, the vocabulary mean of log π_θ (test above)
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]], requires_grad=True)
    old = torch.tensor([[uniform, uniform, 0.0]])
    mean_lp = torch.tensor([[cur_mean, cur_mean, 0.0]])
    old_mean = torch.tensor([[uniform, uniform, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([0.5])
    out = Rover(rho=1.0)(logp, old, adv, mask, mean_logprobs=mean_lp, old_mean_logprobs=old_mean)
    # Q = log π_θ − log π_old: Q_0 = ln 1.5 = 0.405465, Q_1 = ln 0.75 = −0.287682
    q = out.token_stats["rover/q_mean"][0]
    assert q[:2].tolist() == pytest.approx([math.log(1.5), math.log(0.75)], abs=1e-6)
    # mean_v Q(s_1, v) = cur_mean + ln 3 = ln(27/32)/3 = −0.056633 is token 0's next state; token 1 is the last: 0
    next_q = out.token_stats["rover/next_q_mean"][0]
    assert next_q[:2].tolist() == pytest.approx([math.log(27 / 32) / 3, 0.0], abs=1e-6)
    # targets y = A + next: 0.443367 and 0.5; loss (Q − y)²: (−0.037902)² = 0.0014366, (−0.787682)² = 0.620443
    y0 = 0.5 + math.log(27 / 32) / 3
    assert out.token_stats["rover/target_mean"][0, :2].tolist() == pytest.approx([y0, 0.5], abs=1e-6)
    assert out.per_token[0, :2].tolist() == pytest.approx(
        [(math.log(1.5) - y0) ** 2, (math.log(0.75) - 0.5) ** 2], abs=1e-6
    )
    # the target is detached: d/dlog π = 2ρ(Q − y) = −0.075804 and −1.575364
    (out.per_token * mask).sum().backward()
    assert logp.grad[0, :2].tolist() == pytest.approx([2 * (math.log(1.5) - y0), 2 * (math.log(0.75) - 0.5)], abs=1e-5)


def test_rho_scales_q_and_the_next_state_value():
    mean_lp, old_mean = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[0.0, -1.5, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    # ρ·(m_θ − m_old) shifted one position left: positions 1, 2 give 2·0.5 = 1 and 2·(−1) = −2; the last is 0
    assert next_state_values(mean_lp, old_mean, mask, rho=2.0)[0].tolist() == [1.0, -2.0, 0.0]
    with pytest.raises(ValueError, match="rho"):
        Rover(rho=0.0)


def test_the_algorithm_reads_the_old_vocabulary_mean_and_refuses_an_action_mask():
    algo = Algorithm(name="rover", advantage=partial(grpo), loss=Rover())
    assert algo.loss_vocab_mean and algo.token_loss_extras == (OLD_MEAN_LOGPROBS,)
    logp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="vocabulary mean"):
        algo.token_loss(logp, logp, torch.zeros(1), mask, extras={OLD_MEAN_LOGPROBS: logp})
    with pytest.raises(ValueError, match="action_mask"):
        Algorithm(name="rover", advantage=partial(grpo), loss=Rover(), action_mask={"top_p": 0.9})


def _rover_update(steps_per_rollout: int) -> dict[str, float]:
    torch.manual_seed(0)
    model, batch = tiny_policy(), token_batch(n_groups=2, g=2, seed=4)
    token_out = {"mean_logp": torch.zeros_like(batch.sampling_logprobs)}  # the trainer's old forward (loop.py)
    batch.old_logprobs = batch_logprobs(model, batch, 0, 1.0, token_out=token_out)
    batch.extras[OLD_MEAN_LOGPROBS] = token_out["mean_logp"]
    algo = Algorithm(name="rover", advantage=partial(grpo), loss=Rover())
    batch.advantages = algo.compute_advantages(batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return policy_update(
        model, opt, None, batch, algo, mu=1, micro_batch=1, temperature=1.0, max_grad_norm=None,
        steps_per_rollout=steps_per_rollout,
    )  # fmt: skip


def test_the_next_state_term_is_zero_before_the_policy_moves_and_acts_after():
    one = _rover_update(1)  # one optimiser step: the current policy is the old one
    assert one["train/optimizer_steps"] == 1.0 and one["rover/next_q_abs"] < 1e-6 and one["rover/td_abs"] > 0
    two = _rover_update(2)  # the second mini-batch is valued by the moved policy
    assert two["train/optimizer_steps"] == 2.0 and two["rover/next_q_abs"] > 1e-4


def test_rover_trains_two_steps_and_its_next_state_term_acts(tiny_cfg):
    # the config's 4 optimiser steps per rollout (capped at the 2 groups here): from the second the policy has moved
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=rover", "optimizer.lr=1e-3"))
    m = result.metrics
    assert result.last_step == 2 and m["train/optimizer_steps"] == 2
    assert math.isfinite(m["loss/total"]) and m["loss/total"] > 0
    assert m["rover/next_q_abs"] > 1e-6 and math.isfinite(m["rover/target_mean"])
    assert m["rover/q_mean"] != 0.0
