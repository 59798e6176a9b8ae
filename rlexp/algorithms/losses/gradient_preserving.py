"""Clipping that keeps a bounded gradient on the clipped tokens: CE-GPPO ("CE-GPPO: Coordinating Entropy via
Gradient-Preserving Clipping Policy Optimization in Reinforcement Learning", Su et al., 2025; arXiv 2509.20712)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES


@LOSSES.register
def ce_gppo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    beta_low: float = 0.5,
    beta_high: float = 1.0,
    dual_clip: float | None = None,
) -> LossOutput:
    """CE-GPPO: PPO's clipped surrogate, except that the tokens PPO clips to a constant keep a bounded gradient.
    With r = π/π_old and sg the stop-gradient, a token with A < 0 and r < 1 − ε_low takes
    −β_low·(1 − ε_low)·(r / sg(r))·A and one with A > 0 and r > 1 + ε_high takes −β_high·(1 + ε_high)·(r / sg(r))·A:
    the value of PPO's clipped term scaled by β, and the gradient −β·(1 ∓ ε)·A·∇log π — the gradient PPO's
    unclipped term would have at the clip boundary, times β, whatever r is. Every other token is PPO's (−r·A; the
    tokens PPO leaves unclipped). ``dual_clip`` c caps the loss of negative-advantage tokens at −c·A as in
    Dual-Clip PPO (the released loss always applies it: c = 3 by default, 10 in the released scripts). With
    β_low = β_high = 0 the clipped tokens carry no gradient, as in PPO. Stats: ``ce_gppo/preserved_frac``, the
    share of tokens outside the clip interval whose gradient is kept (PPO's clip/region_frac), with the clip
    stats. Released code: Kwai-Klear/CE-GPPO README, ``compute_gppo_loss_general_beta``."""
    eps_high = eps_low if eps_high is None else eps_high
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # value 1, gradient ∇log π
    low = (ratio < 1 - eps_low) & (adv < 0)
    high = (ratio > 1 + eps_high) & (adv > 0)
    loss = torch.where(
        low,
        -beta_low * (1 - eps_low) * unit * adv,
        torch.where(high, -beta_high * (1 + eps_high) * unit * adv, -ratio * adv),
    )
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    stats = ratio_stats(ratio, low, high)
    stats["ce_gppo/preserved_frac"] = (low | high).float()
    return LossOutput(loss, stats)
