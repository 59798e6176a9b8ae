"""A clamp on the log-ratio before the exponential, inside the PPO clip: StableReinforce's Pre-CLIP ("R1-Reward:
Training Multimodal Reward Model Through Stable Reinforcement Learning", Zhang et al., 2025; arXiv 2505.02835)."""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.losses.base import LossOutput
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.core.registry import LOSSES


@LOSSES.register
def stable_reinforce(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    ratio_min: float = 1e-3,
    ratio_max: float = 1e3,
    dual_clip: float | None = None,
) -> LossOutput:
    """StableReinforce's loss: PPO's clipped surrogate (``ppo_clip``) on the ratio exp(clamp(log π − log π_old,
    log ratio_min, log ratio_max)). PPO leaves a negative-advantage token with r > 1 + ε unclipped (loss −r·A), so
    one token whose probability exploded gives a huge loss and gradient; the Pre-CLIP caps its ratio at
    ``ratio_max`` and, as a clamp, gives it no gradient beyond (a token below ``ratio_min`` likewise). Inside the
    bounds it is exactly ``ppo_clip``. Stats: ``stable_reinforce/pre_clip_frac`` (tokens whose log-ratio was
    clamped) and ppo_clip's. Released code: yfzhang114/r1_reward ``openrlhf/models/loss.py`` ``PolicyLoss``
    (bounds 1e-3 and 1e3)."""
    if not 0 < ratio_min < 1 < ratio_max:
        raise ValueError(f"stable_reinforce needs 0 < ratio_min < 1 < ratio_max, got {ratio_min}, {ratio_max}")
    log_ratio = logp - old_logp
    lo, hi = math.log(ratio_min), math.log(ratio_max)
    clamped = log_ratio.clamp(lo, hi)
    out = ppo_clip(old_logp + clamped, old_logp, advantages, mask, eps_low, eps_high, dual_clip)
    out.token_stats["stable_reinforce/pre_clip_frac"] = ((log_ratio < lo) | (log_ratio > hi)).float()
    return out
