"""The plain policy gradient, no ratio, no clip (REINFORCE, OPMD), and DRO's quadratic log-ratio penalty."""

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


@LOSSES.register
def dro(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, beta: float = 0.05
) -> LossOutput:
    """DRO as verl ships it (``loss_mode=dro``, "Direct Reward Optimization", verl PR #7245, docs/algo/dro.md):
    REINFORCE with a quadratic penalty on the token log-ratio to the sampling policy in place of a clip,
    ℓ_t = −(A·log π_θ − β/2·(log π_θ − log π_old)²). Gradient −(A − β·log r)·∇log π: REINFORCE's on-policy
    (r = 1), a shrinking step as log r grows. verl cites no paper; per token this is the gradient of the
    squared residual ½(A − β·log r)²/β of Direct Reward Optimisation (Richemond et al., 2024, arXiv
    2405.19107) with the sampling policy as anchor. ``beta`` > 0 (verl requires it; 0.05 in its PR)."""
    if beta <= 0:
        raise ValueError(f"loss dro beta={beta} must be > 0")
    adv = expand_like(advantages, logp)
    log_ratio = logp - old_logp
    loss = -(adv * logp - 0.5 * beta * log_ratio.square())
    zero = torch.zeros_like(logp, dtype=torch.bool)
    return LossOutput(loss, ratio_stats(torch.exp(log_ratio.detach()), zero, zero))
