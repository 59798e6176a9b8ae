"""Soft gates in place of the hard clip: SAPO's temperature-controlled sigmoid gate."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES


@LOSSES.register
def sapo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> LossOutput:
    """SAPO ("Soft Adaptive Policy Optimization", 2025): the hard clip is replaced by a soft gate,
    ℓ_t = −f(r_t)·A with f(r) = σ(τ(r − 1))·4/τ, τ = τ_pos for A > 0 and τ_neg otherwise. f'(1) = 1,
    so on-policy the gradient equals the unclipped surrogate's; away from r = 1 it decays smoothly.
    No log-ratio clamp (verl clamps it to ±20)."""
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    return LossOutput(-gate * adv, ratio_stats(ratio, zero, zero))
