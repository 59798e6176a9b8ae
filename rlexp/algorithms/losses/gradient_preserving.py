"""Clipping that keeps a bounded gradient on the clipped tokens: CE-GPPO ("CE-GPPO: Coordinating Entropy via
Gradient-Preserving Clipping Policy Optimization in Reinforcement Learning", Su et al., 2025; arXiv 2509.20712) and
AEPO's entropy-balanced clipping ("Agentic Entropy-Balanced Policy Optimization", Dong et al., 2025; arXiv
2510.14545)."""

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


@LOSSES.register
def aepo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> LossOutput:
    """AEPO's entropy clipping-balanced surrogate: PPO's clipped loss (with verl's dual clip for A < 0) whose upper
    bound is (1 + ε_high)·r / sg(r) — the value 1 + ε_high, the gradient (1 + ε_high)·∇log π. A token with A > 0 and
    r > 1 + ε_high, which PPO clips to a constant (the paper's high-entropy tokens, whose probability moves most),
    keeps the gradient −(1 + ε_high)·A·∇log π; every other token is PPO's (the lower clip r < 1 − ε_low with A < 0 stays
    a constant, and the dual clip caps the loss of A < 0 tokens at −c·A). The gradient is CE-GPPO's with β_low = 0,
    β_high = 1 (``ce_gppo``); the values are PPO's. Released code: ``compute_policy_loss_entropy_balanced_clipping``
    (``enable_entropy_balanced_clipping``; dongguanting/ARPO, AEPO/verl_aepo_entropy ``core_algos.py``):
    ``max_bound = (1 + ε_high) / ratio.detach() * ratio`` inside ``torch.clamp``. Stats:
    ``aepo/high_clipped_frac`` (the tokens whose gradient the stop-gradient keeps), with the clip stats."""
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"algorithm.loss.dual_clip must be > 1 or null, got {dual_clip}")
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # value 1, gradient ∇log π
    low = (ratio < 1 - eps_low) & (adv < 0)
    high = (ratio > 1 + eps_high) & (adv > 0)
    loss = torch.where(high, -(1 + eps_high) * unit * adv, torch.where(low, -(1 - eps_low) * adv, -ratio * adv))
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    stats = ratio_stats(ratio, low, high)
    stats["aepo/high_clipped_frac"] = high.float()
    return LossOutput(loss, stats)
