"""The plain policy gradient, no ratio, no clip."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES


@LOSSES.register
def reinforce(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> LossOutput:
    """Plain REINFORCE ("Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning", Williams 1992): ℓ_t = −A·log π_θ. On-policy only (ignores old_logp,
    which is reported as ratio statistics); also GPG's and ReMax's loss."""
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    return LossOutput(-adv * logp, ratio_stats(ratio, zero, zero))
