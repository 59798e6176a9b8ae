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


@LOSSES.register
def opmd(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, tau: float = 1.0
) -> LossOutput:
    """OPMD's policy loss ("Group-Relative REINFORCE is Secretly an Off-Policy Algorithm", 2025; Trinity-RFT's
    ``opmd`` loss): REINFORCE, −A·log π_θ, scaled by 1/(1 + τ) — the mirror-descent step's regularisation
    towards the current policy, τ its strength. No importance ratio: the paper's point is that this group-
    relative REINFORCE stays valid on stale (off-policy) data. Also AsymRE's loss (τ = 1)."""
    if tau < 0:
        raise ValueError(f"loss opmd tau={tau} must be >= 0")
    out = reinforce(logp, old_logp, advantages, mask)
    return LossOutput(out.per_token / (1.0 + tau), out.token_stats)
