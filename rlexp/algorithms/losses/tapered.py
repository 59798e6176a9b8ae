"""Tapered importance sampling: TOPR ("Tapered Off-Policy REINFORCE: Stable and efficient reinforcement
learning for LLMs", Le Roux et al., 2025)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput
from rlexp.core.registry import LOSSES


@LOSSES.register
def topr(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> LossOutput:
    """TOPR: ∇J = Σ_{A ≥ 0} A·∇log π(y) + Σ_{A < 0} sg([π(y)/μ(y)]₀¹)·A·∇log π(y). Sequences with a
    non-negative advantage get the plain (SFT-like) REINFORCE gradient, however unlikely the current policy
    finds them; negative ones are weighted by their sequence-level importance ratio truncated to [0, 1], so
    pushing down an already unlikely wrong answer fades out instead of blowing up the logits. ``μ`` is the
    policy that sampled (``old_logp``); the ratio is over the whole sequence, exp Σ_t (log π − log μ).
    Per-sequence advantages only (the sign is the sequence's)."""
    if advantages.dim() != 1:
        raise ValueError("loss topr needs one advantage per sequence (N,), got token-level advantages")
    m = mask.to(logp.dtype)
    seq_log_ratio = ((logp - old_logp).detach() * m).sum(-1)
    ratio = torch.exp(seq_log_ratio)
    negative = advantages < 0
    weight = torch.where(negative, ratio.clamp(max=1.0), torch.ones_like(ratio))
    per_token = -(weight * advantages)[:, None] * logp
    tapered = (negative & (ratio < 1.0)).float()[:, None].expand_as(logp)
    return LossOutput(
        per_token,
        {"topr/tapered_frac": tapered, "topr/negative_frac": negative.float()[:, None].expand_as(logp),
         "ratio/mean": ratio[:, None].expand_as(logp)},
    )  # fmt: skip
