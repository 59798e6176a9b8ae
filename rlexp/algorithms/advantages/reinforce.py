"""REINFORCE-style advantages: the raw reward, and REINFORCE++'s token returns whitened over the batch.

Token-level rewards (verl's ``token_level_rewards``): :func:`token_level_rewards` lays out the reward a
per-token estimator (REINFORCE++, GAE) consumes — the outcome reward at the last valid token, minus the
KL-in-reward penalty at each token (``algorithm.kl.mode=reward``: ``batch.extras["kl_penalty"]``), plus any
rewards a stage or reward term placed at token positions (``batch.extras["token_rewards"]``, (N, T), e.g. a
process reward's per-step score at each step's last token; added to the outcome, not instead of it — a term
that pays only per step leaves its outcome column at 0)."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import KL_PENALTY, TOKEN_REWARDS
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import batch_mean, group_stats, masked_whiten


def token_level_rewards(batch: RolloutBatch, outcome_reward: bool = True) -> torch.Tensor:
    """(N, T) reward at each token (see the module docstring): r_t = 1[t = last]·R_outcome − β·KL_t + u_t on
    valid tokens, 0 on padding, where R_outcome = ``batch.reward`` + Σ_t β·KL_t (the reward before the trainer's
    whole-completion KL charge) and u = ``batch.extras["token_rewards"]``. ``outcome_reward=False``: R_outcome is
    not paid (DVPO: a frozen value model stands in for the reward; only −β·KL_t + u_t remain)."""
    mask = batch.completion_mask.float()
    n, width = mask.shape
    outcome = batch.reward.float().clone()
    rewards = torch.zeros_like(mask)
    penalty = batch.extras.get(KL_PENALTY)
    if penalty is not None:
        penalty = penalty.float().to(mask.device) * mask
        outcome = outcome + penalty.sum(-1)
        rewards = rewards - penalty
    extra = batch.extras.get(TOKEN_REWARDS)
    if extra is not None:
        if tuple(extra.shape) != (n, width):
            raise ValueError(
                f"batch.extras['token_rewards'] has shape {tuple(extra.shape)}; expected (N, T) = {(n, width)}"
            )
        rewards = rewards + extra.float().to(mask.device) * mask
    has_tokens = mask.sum(-1) > 0
    last = (mask.sum(-1) - 1).clamp(min=0).long()
    rows = torch.arange(n, device=mask.device)[has_tokens]
    if outcome_reward:
        rewards[rows, last[has_tokens]] += outcome[has_tokens]
    return rewards


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = Σ_{s≥t, valid} γ^(#valid tokens between)·r_s at each valid token, 0 elsewhere; a masked position
    passes the running return through unchanged (verl's ``compute_reinforce_plus_plus_outcome_advantage``)."""
    m = mask.float()
    out = torch.zeros_like(rewards, dtype=torch.float32)
    running = torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        new = rewards[:, t].float() + gamma * running
        out[:, t] = new * m[:, t]
        running = new * m[:, t] + running * (1 - m[:, t])
    return out


@ADVANTAGES.register
def raw_reward(batch: RolloutBatch, baseline: str | float = "none") -> torch.Tensor:
    """The reward itself as advantage (plain REINFORCE; Williams, 1992), optionally minus a baseline:
    ``none``, ``batch`` (mean reward of the batch), ``group`` (mean reward of the row's group) or a
    constant c (TOPR's baseline parameter, "Tapered Off-Policy REINFORCE", 2025)."""
    r = batch.reward.float()
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        return r - float(baseline)
    if baseline == "none":
        return r.clone()
    if baseline == "batch":
        return r - batch_mean(r)  # over every process's rows in a distributed step
    if baseline == "group":
        mean, _, _ = group_stats(r, batch.group_ids)
        return r - mean
    raise ValueError(f"advantage raw_reward baseline={baseline!r} is not one of ['none', 'batch', 'group'] or a number")


@ADVANTAGES.register
def reinforce_pp(batch: RolloutBatch, gamma: float = 1.0, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    2025): the discounted return G_t = Σ_{s≥t} γ^(s−t)·r_s of the token-level rewards
    (:func:`token_level_rewards`) at every token, whitened over all valid tokens of the batch (global batch
    normalisation; verl's ``reinforce_plus_plus`` on its ``token_level_rewards``). Returns (N, T).
    The KL penalty the paper puts into the reward is the trainer's ``algorithm.kl.mode=reward``; with its
    per-token penalties (``batch.extras["kl_penalty"]``, β·KL_t) each token's return carries the KL from that
    token to the end, G_t = R − Σ_{s≥t} γ^(s−t)·β·KL_s (the paper's and verl's token-level rewards), not the
    whole completion's; process rewards in ``batch.extras["token_rewards"]`` enter the same way."""
    mask = batch.completion_mask
    returns = discounted_returns(token_level_rewards(batch), mask, gamma)
    return masked_whiten(returns, mask, eps) * mask


reinforce_pp.token_rewards = True  # consumes batch.extras["token_rewards"] (Algorithm.compute_advantages)


def _reverse_discounted_sum(values: torch.Tensor, gamma: float) -> torch.Tensor:
    """Σ_{s≥t} γ^(s−t)·values_s for every t (no padding)."""
    return discounted_returns(values, torch.ones_like(values), gamma)


@ADVANTAGES.register
def reinforce_pp_baseline(batch: RolloutBatch, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++-baseline (same paper, group variant): subtract the group mean reward, then whiten
    over all valid tokens of the batch (longer completions weigh more; verl's
    ``reinforce_plus_plus_baseline``). A singleton group uses baseline 0 (verl). Returns (N, T)."""
    mean, _, count = group_stats(batch.reward, batch.group_ids)
    centred = batch.reward.float() - torch.where(count > 1, mean, torch.zeros_like(mean))
    tokens = centred[:, None] * batch.completion_mask.float()
    return masked_whiten(tokens, batch.completion_mask, eps) * batch.completion_mask
