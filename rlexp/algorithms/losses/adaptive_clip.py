"""Clip bounds that adapt to the batch: BAPO ("BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs
via Balanced Policy Optimization with Adaptive Clipping", Xi et al., 2025)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.core.registry import LOSSES


def balance(ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """The positive tokens' share of the policy gradient under bounds [low, high]: Σ r·A over the positive-
    advantage tokens the clip lets through (r ≤ high) over that plus Σ r·|A| over the negative ones it lets
    through (r ≥ low); clipped tokens carry no gradient. 1 when nothing passes."""
    m = mask.bool()
    pos = ((adv > 0) & (ratio <= high) & m).to(ratio.dtype)
    neg = ((adv < 0) & (ratio >= low) & m).to(ratio.dtype)
    p, n = float((ratio * adv * pos).sum()), float((ratio * -adv * neg).sum())
    return 1.0 if p + n <= 0 else p / (p + n)


def adapt_bounds(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, target: float,
    lower: tuple[float, float, float], upper: tuple[float, float, float],
) -> tuple[float, float, float]:  # fmt: skip
    """BAPO's bound search: from (lower start, upper start), raise the lower bound by its step (up to its
    max) while the positive share (``balance``) is under ``target``, then the upper bound likewise. Raising
    the lower bound clips more of the negative tokens whose ratio fell; raising the upper one lets more
    positive tokens through. Returns (low, high, share)."""
    low, low_max, low_step = lower
    high, high_max, high_step = upper
    b = balance(ratio, adv, mask, low, high)
    while b < target and low < low_max and low_step > 0:
        low = min(low + low_step, low_max)
        b = balance(ratio, adv, mask, low, high)
    while b < target and high < high_max and high_step > 0:
        high = min(high + high_step, high_max)
        b = balance(ratio, adv, mask, low, high)
    return low, high, b


@LOSSES.register
def bapo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    target_share: float = 0.5,
    lower_start: float = 0.6,
    lower_max: float = 0.9,
    lower_step: float = 0.05,
    upper_start: float = 1.2,
    upper_max: float = 3.0,
    upper_step: float = 0.05,
    dual_clip: float | None = 3.0,
) -> LossOutput:
    """BAPO: the PPO clipped surrogate (with dual clip) whose ratio bounds [low, high] are searched per batch
    (``adapt_bounds``) so that the positive-advantage tokens carry at least ``target_share`` (ρ₀) of the
    policy gradient — negative tokens otherwise dominate an off-policy gradient, and the fixed clip blocks the
    entropy-raising updates. Bounds are explicit ratios (0.6, 1.2), not ε. The search runs over the
    micro-batch being differentiated (the released verl code: per micro-batch, summed over ranks)."""
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    low, high, b = adapt_bounds(ratio, adv, mask, target_share, (lower_start, lower_max, lower_step),
                                (upper_start, upper_max, upper_step))  # fmt: skip
    out = ppo_clip(logp, old_logp, advantages, mask, eps_low=1.0 - low, eps_high=high - 1.0, dual_clip=dual_clip)
    const = torch.ones_like(ratio)
    out.token_stats.update(
        {"bapo/clip_low": const * low, "bapo/clip_high": const * high, "bapo/positive_share": const * b}
    )
    return out
