"""Clipped importance-ratio losses: PPO-clip (clip-higher, dual clip, INTELLECT-2's two-sided δ) and CISPO's
clipped, stop-gradient IS weight (token- or sequence-level)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, clamp_log_ratio, expand_like, ratio_stats, seq_mean
from rlexp.core.registry import LOSSES


@LOSSES.register
def ppo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    delta: float | None = None,
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """PPO clipped surrogate (Proximal Policy Optimization Algorithms, 2017) as used by GRPO
    (DeepSeekMath, 2024), with asymmetric clip-higher ε_low/ε_high (DAPO, 2025) and optional dual
    clip ``c`` that caps the loss of negative-advantage tokens at c·|A| (Dual-Clip PPO, 2019), and
    optional two-sided clip ``delta`` δ: the unclipped term's ratio is first capped at δ (INTELLECT-2, 2025;
    TRL's ``delta``), −min(min(r, δ)·A, clip(r)·A). For δ ≥ 1 + ε_high that equals ``dual_clip=δ``; below,
    it also caps positive-advantage tokens. ``log_ratio_clamp``: verl's clamp of log r to ±c (verl: 20); null:
    none (TRL's convention). Metrics: ``clip/region_frac`` is TRL's ``clip_ratio/region_mean`` and verl's
    ``actor/pg_clipfrac``; with a dual clip, ``clip/dual_frac`` is verl's ``actor/pg_clipfrac_lower`` (A < 0
    tokens whose loss the dual clip caps)."""
    eps_high = eps_low if eps_high is None else eps_high
    adv = expand_like(advantages, logp)
    ratio = torch.exp(clamp_log_ratio(logp - old_logp, log_ratio_clamp))
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    if delta is not None:
        if delta <= 1:
            raise ValueError(f"delta must be > 1, got {delta}")
        loss = -torch.min(ratio.clamp(max=delta) * adv, clipped * adv)
    else:
        loss = -torch.min(ratio * adv, clipped * adv)
    dual = None
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        dual = ((loss > -dual_clip * adv) & (adv < 0)).float()
        loss = torch.where(adv < 0, torch.min(loss, -dual_clip * adv), loss)
    low = ((ratio < 1 - eps_low) & (adv < 0)).float()
    high = ((ratio > 1 + eps_high) & (adv > 0)).float()
    stats = {
        "clip/low_frac": low,
        "clip/high_frac": high,
        "clip/region_frac": torch.clamp(low + high, max=1),
        "ratio/mean": ratio.detach(),
    }
    if dual is not None:
        stats["clip/dual_frac"] = dual
    return LossOutput(loss, stats)


@LOSSES.register
def cispo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float | None = None,
    eps_high: float = 4.0,
    level: str = "token",
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """CISPO ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", 2025):
    REINFORCE with a clipped, stop-gradient importance weight, ℓ_t = −sg(clip(r_t, 1 − ε_low,
    1 + ε_high))·A·log π_θ — every token keeps a gradient. ``eps_low=None`` leaves the ratio
    unbounded below (the paper's ε_low is large). TRL's ``epsilon_high`` for cispo is the absolute cap
    1 + ε_high here (ε_high = 4 ⇔ TRL 5.0, ScaleRL's value). ``level="sequence"``: one weight per sequence
    from the length-normalised sequence ratio exp(mean_t log r_t) (TRL's ``importance_sampling_level=
    "sequence"`` with cispo; verl ships the token level only). ``log_ratio_clamp``: verl's ±c on the token
    log-ratio (verl: 20). ``clip/bound_frac``: tokens whose weight is clipped whatever the advantage's sign
    (verl's cispo ``actor/pg_clipfrac``); ``clip/high_frac`` is TRL's ``cispo_clip_ratio``."""
    adv = expand_like(advantages, logp)
    log_ratio = clamp_log_ratio((logp - old_logp).detach(), log_ratio_clamp)
    if level == "sequence":
        log_ratio = seq_mean(log_ratio, mask).unsqueeze(-1).expand_as(logp)
    elif level != "token":
        raise ValueError(f"loss cispo level={level!r} is not one of ['token', 'sequence']")
    ratio = torch.exp(log_ratio)
    lo = None if eps_low is None else 1 - eps_low
    weight = ratio.clamp(min=lo, max=1 + eps_high)
    loss = -weight * adv * logp
    low = (ratio < lo) & (adv < 0) if lo is not None else torch.zeros_like(ratio, dtype=torch.bool)
    stats = ratio_stats(ratio, low, (ratio > 1 + eps_high) & (adv > 0))
    stats["clip/bound_frac"] = (weight != ratio).float()
    return LossOutput(loss, stats)
