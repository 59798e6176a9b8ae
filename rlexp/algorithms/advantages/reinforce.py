"""REINFORCE-style advantages: the raw reward, and REINFORCE++'s token returns whitened over the batch."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import KL_PENALTY
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_stats, masked_whiten


def _token_returns(reward: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return at each valid token of an outcome reward paid at the last valid token:
    G_t = γ^(L−1−t)·R for t < L (zero on padding)."""
    m = mask.float()
    lengths = m.sum(-1, keepdim=True)
    t = torch.arange(mask.shape[1], device=mask.device, dtype=torch.float32)[None, :]
    steps_to_end = (lengths - 1 - t).clamp(min=0)
    return reward.float()[:, None] * torch.pow(torch.tensor(float(gamma), device=mask.device), steps_to_end) * m


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
        return r - r.mean() if r.numel() else r.clone()
    if baseline == "group":
        mean, _, _ = group_stats(r, batch.group_ids)
        return r - mean
    raise ValueError(f"advantage raw_reward baseline={baseline!r} is not one of ['none', 'batch', 'group'] or a number")


@ADVANTAGES.register
def reinforce_pp(batch: RolloutBatch, gamma: float = 1.0, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    2025): the (discounted) return of the outcome reward at every token, whitened over all valid tokens
    of the batch (global batch normalisation; verl's ``reinforce_plus_plus``). Returns (N, T).
    The KL penalty the paper puts into the reward is the trainer's ``algorithm.kl.mode=reward``; with its
    per-token penalties (``batch.extras["kl_penalty"]``, β·KL_t) each token's return carries the KL from that
    token to the end, G_t = R − Σ_{s≥t} γ^(s−t)·β·KL_s (the paper's and verl's token-level rewards), not the
    whole completion's."""
    mask = batch.completion_mask
    penalty = batch.extras.get(KL_PENALTY)
    if penalty is None:
        returns = _token_returns(batch.reward, mask, gamma)
    else:
        penalty = penalty.float() * mask
        outcome = batch.reward.float() + penalty.sum(-1)  # the reward before the whole-completion KL charge
        returns = _token_returns(outcome, mask, gamma) - _reverse_discounted_sum(penalty, gamma) * mask
    return masked_whiten(returns, mask, eps) * mask


def _reverse_discounted_sum(values: torch.Tensor, gamma: float) -> torch.Tensor:
    """Σ_{s≥t} γ^(s−t)·values_s for every t (values already zero on padding)."""
    out = torch.zeros_like(values)
    running = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for t in reversed(range(values.shape[1])):
        running = values[:, t] + gamma * running
        out[:, t] = running
    return out


@ADVANTAGES.register
def reinforce_pp_baseline(batch: RolloutBatch, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++-baseline (same paper, group variant): subtract the group mean reward, then whiten
    over all valid tokens of the batch (longer completions weigh more; verl's
    ``reinforce_plus_plus_baseline``). A singleton group uses baseline 0 (verl). Returns (N, T)."""
    mean, _, count = group_stats(batch.reward, batch.group_ids)
    centred = batch.reward.float() - torch.where(count > 1, mean, torch.zeros_like(mean))
    tokens = centred[:, None] * batch.completion_mask.float()
    return masked_whiten(tokens, batch.completion_mask, eps) * batch.completion_mask
