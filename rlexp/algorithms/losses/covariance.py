"""Covariance-selected token updates (The Entropy Mechanism of RL for Reasoning LMs, 2025): Clip-Cov and KL-Cov."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES


def _token_cov(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Centred product (A − mean A)(log π − mean log π) per token, means over the valid tokens."""
    m = mask.bool()
    count = m.sum().clamp(min=1)
    a_mean = (adv * m).sum() / count
    l_mean = (logp.detach() * m).sum() / count
    return (adv - a_mean) * (logp.detach() - l_mean)


@LOSSES.register
def clip_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> LossOutput:
    """Clip-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    2025): among the tokens the PPO clip leaves unclipped, those whose centred covariance
    (A − Ā)(log π − mean log π) lies in (cov_lb, cov_ub) are candidates; ⌊clip_ratio·#tokens⌋ (≥ 1)
    of them, drawn at random, get no gradient (loss × 0). Statistics are over the micro-batch (verl)."""
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    valid = mask.bool()
    clipped_by_ppo = (l2 > l1) & valid
    cov = _token_cov(logp, adv, mask)
    candidates = ((cov > cov_lb) & (cov < cov_ub) & valid & ~clipped_by_ppo).nonzero()
    keep = torch.ones_like(ratio)
    n = max(int(clip_ratio * int(valid.sum())), 1)
    if len(candidates):
        perm = torch.randperm(len(candidates), generator=generator, device="cpu")[:n].to(candidates.device)
        chosen = candidates[perm]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = torch.maximum(l1, l2) * keep
    stats = ratio_stats(ratio, (ratio < 1 - eps_low) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0))
    stats["cov/detached_frac"] = (keep == 0).float()
    return LossOutput(loss, stats)


@LOSSES.register
def kl_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_ratio: float = 2e-3,
    kl_coef: float = 1.0,
) -> LossOutput:
    """KL-Cov (same paper): unclipped surrogate −A·r_t, plus a penalty kl_coef·|log r_t| on the
    ⌊kl_ratio·#tokens⌋ (≥ 1) valid tokens with the largest centred covariance
    (A − Ā)(log π − mean log π). Statistics are over the micro-batch (verl)."""
    adv = expand_like(advantages, logp)
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    loss = -adv * ratio
    valid = mask.bool()
    penalised = torch.zeros_like(ratio)
    if valid.any():
        cov = _token_cov(logp, adv, mask).masked_fill(~valid, float("-inf"))
        k = max(int(kl_ratio * int(valid.sum())), 1)
        top = torch.topk(cov.flatten(), k).indices
        penalised.view(-1)[top] = 1.0
        loss = loss + penalised * kl_coef * log_ratio.abs()
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    stats = ratio_stats(ratio, zero, zero)
    stats["cov/penalised_frac"] = penalised
    return LossOutput(loss, stats)
