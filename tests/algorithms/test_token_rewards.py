"""Token-level rewards (issue 20 §2): REINFORCE++ and GAE on per-token rewards — the outcome reward at the last
token, the KL-in-reward penalty per token, process rewards in ``batch.extras["token_rewards"]`` — by hand and
against verl's estimators on random tensors.

verl's side is transcribed from verl-project/verl @ 1dda039 (verl/trainer/ppo/core_algos.py:
``compute_reinforce_plus_plus_outcome_advantage``, ``compute_gae_advantage_return``; verl/utils/torch_functional.py:
``masked_mean``, ``masked_var``, ``masked_whiten``; the reward manager puts the outcome score at the last valid
token and ``apply_kl_penalty`` subtracts β·KL_t per token: token_level_rewards = token_level_scores − β·kld).
"""

from __future__ import annotations

import pytest
import torch

from rlexp.algorithms.advantages.gae import gae
from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.advantages.reinforce import (
    discounted_returns,
    reinforce_pp,
    token_level_rewards,
)
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.core.masks import KL_PENALTY, TOKEN_REWARDS
from rlexp.core.stats import masked_whiten
from tests.algorithms.batches import make_batch

# ---------------------------------------------------------------- verl, transcribed


def verl_masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def verl_masked_whiten(values, mask):
    mean = verl_masked_mean(values, mask)
    var = verl_masked_mean((values - mean) ** 2, mask)
    n = mask.sum()
    var = var * n / (n - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        new_running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = new_running_return * response_mask[:, t]
        running_return = new_running_return * response_mask[:, t] + running_return * (1 - response_mask[:, t])
    advantages = verl_masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    nextvalues, lastgaelam, rev = 0, 0, []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        rev.append(lastgaelam)
    advantages = torch.stack(rev[::-1], dim=1)
    returns = advantages + values
    return verl_masked_whiten(advantages, response_mask), returns


def verl_token_level_rewards(scores, step_rewards, kld, beta, mask):
    """The reward manager's token_level_scores (outcome at the last valid token, plus the per-step scores a
    process reward places) minus apply_kl_penalty's β·KL_t."""
    n, width = mask.shape
    token_level_scores = step_rewards * mask
    last = mask.sum(-1).long() - 1
    for i in range(n):
        if last[i] >= 0:
            token_level_scores[i, last[i]] += scores[i]
    return token_level_scores - beta * kld * mask


# ---------------------------------------------------------------- by hand


def _batch(rewards, lengths, width):
    return make_batch(rewards, list(range(len(rewards))), lengths=lengths, width=width)


def test_token_level_rewards_lay_out_outcome_kl_and_process_rewards():
    """Row 0: 3 tokens, outcome 1 (the trainer's reward is 1 − 0.6 after the whole-completion KL charge), β·KL =
    (0.1, 0.2, 0.3), process rewards 0.5 at token 0 and −0.25 at token 2: r = (0.4, −0.2, 1 − 0.3 − 0.25).
    Row 1: 2 tokens of 3, outcome 2, a process reward on the padding is dropped."""
    b = _batch([0.4, 2.0], [3, 2], 3)
    b.extras[KL_PENALTY] = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0]])
    b.extras[TOKEN_REWARDS] = torch.tensor([[0.5, 0.0, -0.25], [0.0, 0.0, 7.0]])
    torch.testing.assert_close(token_level_rewards(b), torch.tensor([[0.4, -0.2, 0.45], [0.0, 2.0, 0.0]]))
    b.extras[TOKEN_REWARDS] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"token_rewards.*\(2, 3\)"):
        token_level_rewards(b)


def test_reinforce_pp_discounts_step_rewards():
    """γ = 0.5, one row of 3 tokens, process rewards (1, 0, 0), outcome 2: G = (1 + 0.25·2, 0.5·2, 2) =
    (1.5, 1, 2), then whitened over the batch's tokens (a second row: outcome 0, returns 0)."""
    b = _batch([2.0, 0.0], [3, 3], 3)
    b.extras[TOKEN_REWARDS] = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.5, 1.0, 2.0], [0.0, 0.0, 0.0]])
    mask = b.completion_mask
    torch.testing.assert_close(reinforce_pp(b, gamma=0.5), masked_whiten(returns, mask) * mask)
    # discounted_returns by hand, a masked middle position passing the return through unchanged (verl)
    got = discounted_returns(torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[1, 0, 1]]), 0.5)
    torch.testing.assert_close(got, torch.tensor([[2.0, 0.0, 2.0]]))


def test_gae_on_step_rewards_by_hand():
    """One row of 3 tokens, V = (0.5, 0.25, 1), r = (1, 0, 2) (process reward 1 at token 0, outcome 2), γ = 0.5,
    λ = 0.5: δ = (1 + 0.125 − 0.5, 0 + 0.5 − 0.25, 2 − 1) = (0.625, 0.25, 1); A_2 = 1, A_1 = 0.25 + 0.25·1 = 0.5,
    A_0 = 0.625 + 0.25·0.5 = 0.75; returns A + V = (1.25, 0.75, 2)."""
    b = _batch([2.0], [3], 3)
    b.values = torch.tensor([[0.5, 0.25, 1.0]])
    b.extras[TOKEN_REWARDS] = torch.tensor([[1.0, 0.0, 0.0]])
    adv = gae(b, gamma=0.5, lam=0.5, whiten=False)
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.5, 1.0]]))
    torch.testing.assert_close(b.extras["returns"], torch.tensor([[1.25, 0.75, 2.0]]))


def test_gae_charges_the_kl_penalty_per_token():
    """γ = λ = 1, V = 0: A_t is the sum of the rewards from t on, so each token carries the KL from itself to the
    end, R − Σ_{s≥t} β·KL_s, not the whole completion's (the estimate before this change)."""
    b = _batch([1.0 - 0.6], [3], 3)
    b.values = torch.zeros(1, 3)
    b.extras[KL_PENALTY] = torch.tensor([[0.1, 0.2, 0.3]])
    torch.testing.assert_close(gae(b, gamma=1.0, lam=1.0, whiten=False), torch.tensor([[0.4, 0.5, 0.7]]))


# ---------------------------------------------------------------- against verl


def _random_case(seed, n=6, width=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 4, 0, 6, 3])[:n]
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    scores = torch.randn(n, generator=g)
    steps = torch.randn(n, width, generator=g) * (torch.rand(n, width, generator=g) < 0.3)  # sparse step rewards
    kld = torch.randn(n, width, generator=g).abs()
    values = torch.randn(n, width, generator=g)
    return lengths, mask, scores, steps, kld, values


def _our_batch(lengths, mask, scores, steps, kld, beta, values=None):
    n, width = mask.shape
    b = make_batch(
        (scores - beta * (kld * mask).sum(-1)).tolist(), list(range(n)), lengths=lengths.tolist(), width=width
    )
    b.extras[KL_PENALTY] = beta * kld * mask  # what the trainer writes for algorithm.kl.mode=reward
    b.extras[TOKEN_REWARDS] = steps
    b.values = values
    return b


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_verl(seed, gamma):
    lengths, mask, scores, steps, kld, _ = _random_case(seed)
    beta = 0.05
    b = _our_batch(lengths, mask, scores, steps, kld, beta)
    want, want_returns = verl_reinforce_pp(verl_token_level_rewards(scores, steps, kld, beta, mask), mask, gamma)
    torch.testing.assert_close(discounted_returns(token_level_rewards(b), mask, gamma), want_returns)
    torch.testing.assert_close(reinforce_pp(b, gamma=gamma), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_matches_verl(seed, gamma, lam):
    lengths, mask, scores, steps, kld, values = _random_case(seed)
    beta = 0.05
    b = _our_batch(lengths, mask, scores, steps, kld, beta, values)
    want, want_returns = verl_gae(verl_token_level_rewards(scores, steps, kld, beta, mask), values, mask, gamma, lam)
    got = gae(b, gamma=gamma, lam=lam, whiten=True)
    torch.testing.assert_close(got, want * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.extras["returns"], want_returns * mask, atol=1e-6, rtol=1e-6)


def test_outcome_estimators_refuse_token_rewards():
    """An outcome-only estimator would drop per-token rewards silently: Algorithm.compute_advantages refuses."""
    b = _batch([1.0, 0.0], [2, 2], 2)
    b.extras[TOKEN_REWARDS] = torch.ones(2, 2)
    algo = Algorithm(name="t", advantage=grpo, loss=ppo_clip)
    with pytest.raises(ValueError, match="token_rewards.*grpo.*reinforce_pp or gae"):
        algo.compute_advantages(b)
    ok = Algorithm(name="t", advantage=reinforce_pp, loss=ppo_clip)
    assert ok.compute_advantages(b).shape == (2, 2)
