"""A trust region on the second moment of the importance log-ratios: M2PO ("Second-Moment Trust Policy
Optimization", Zheng et al., 2025; arXiv 2510.01161)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.registry import LOSSES


def second_moment_mask(log_ratio: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """(N, T) bool: the valid tokens kept once the fewest tokens with the largest (log r)² are masked so that
    the mean (log r)² of the rest, M̂₂, is at most ``threshold`` (nothing is masked when it already is)."""
    valid = mask.bool()
    m2 = log_ratio.detach().float() ** 2
    values = m2[valid]
    keep = valid.clone()
    n = values.numel()
    if n == 0 or float(values.mean()) <= threshold:
        return keep
    ordered, order = torch.sort(values, descending=True)
    removed = torch.cat([ordered.new_zeros(1), ordered.cumsum(0)[:-1]])  # mass of the j largest, j = 0..n-1
    remaining_mean = (ordered.sum() - removed) / torch.arange(n, 0, -1, dtype=ordered.dtype)
    ok = (remaining_mean <= threshold).nonzero()
    j = int(ok[0]) if ok.numel() else n  # how many of the largest to mask
    flat = keep[valid]
    flat[order[:j]] = False
    keep[valid] = flat
    return keep


@LOSSES.register
def m2po(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, m2_threshold: float = 0.04
) -> LossOutput:
    """M2PO: instead of clipping each ratio, mask the tokens with the most extreme log-ratios until the
    second moment M̂₂ = mean (log π/π_old)² of the remaining tokens is ≤ ``m2_threshold``; the kept tokens
    take the unclipped surrogate −r·A (objective as in AReaL's M2PO documentation). The statistic is taken
    over the micro-batch being differentiated (the paper: the training batch)."""
    log_ratio = logp - old_logp
    keep = second_moment_mask(log_ratio, mask, m2_threshold)
    ratio = torch.exp(log_ratio)
    adv = expand_like(advantages, logp)
    per_token = -ratio * adv * keep.to(logp.dtype)
    masked = (mask.bool() & ~keep).float()
    return LossOutput(per_token, {"m2po/masked_frac": masked, "clip/region_frac": masked, "ratio/mean": ratio.detach()})
