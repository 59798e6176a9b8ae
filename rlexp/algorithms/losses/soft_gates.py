"""Soft gates in place of the hard clip: SAPO's temperature-controlled sigmoid gate (token- or sequence-level)
and VESPO's Gamma-shaped weight on the sequence importance ratio."""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.losses.base import LossOutput, clamp_log_ratio, expand_like, ratio_stats, seq_mean
from rlexp.core.registry import LOSSES


@LOSSES.register
def sapo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    level: str = "token",
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """SAPO ("Soft Adaptive Policy Optimization", 2025): the hard clip is replaced by a soft gate,
    ℓ_t = −f(r_t)·A with f(r) = σ(τ(r − 1))·4/τ, τ = τ_pos for A > 0 and τ_neg otherwise. f'(1) = 1,
    so on-policy the gradient equals the unclipped surrogate's; away from r = 1 it decays smoothly.
    ``log_ratio_clamp``: verl's ±c on the token log-ratio (verl: 20; null: none, TRL).
    ``level="sequence"``: the gate acts on GSPO's length-normalised sequence ratio s_i, in the GSPO-token
    form (value s_i, gradient s_i·∇log π_t per token),
    which with seq-mean-token-mean and one advantage per sequence equals TRL's sapo with
    ``importance_sampling_level="sequence"`` in value and gradient (verl ships the token level only)."""
    adv = expand_like(advantages, logp)
    log_ratio = clamp_log_ratio(logp - old_logp, log_ratio_clamp)
    if level == "sequence":
        log_seq = seq_mean(log_ratio, mask).detach()
        ratio = torch.exp(logp - logp.detach() + log_seq.unsqueeze(-1))
    elif level == "token":
        ratio = torch.exp(log_ratio)
    else:
        raise ValueError(f"loss sapo level={level!r} is not one of ['token', 'sequence']")
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    return LossOutput(-gate * adv, ratio_stats(ratio, zero, zero))


@LOSSES.register
def vespo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> LossOutput:
    """VESPO ("Variational Sequence-Level Soft Policy Optimization", 2026, arXiv 2602.10693; TRL's
    ``loss_type="vespo"``): REINFORCE weighted by a detached Gamma-shaped function of the sequence importance
    ratio w = π_θ(y)/π_old(y) = exp Σ_t log r_t (not length-normalised), ℓ_t = −φ(w)·A·log π_θ with
    φ(w) = w^k·exp(λ(1 − w)), (k, λ) = (k_pos, λ_pos) for A ≥ 0 and (k_neg, λ_neg) otherwise. φ(1) = 1, so
    on-policy it is REINFORCE; it fades smoothly for w far from 1 on both sides instead of a hard clip.
    The clamps are TRL's (the release's): token log-ratios to ±20, log w to [ln 1e-8, 20]; φ non-finite → 0.
    Use with token-mean (TRL)."""
    adv = expand_like(advantages, logp)
    m = mask.to(logp.dtype)
    log_ratio = (logp - old_logp).detach()
    log_w = (log_ratio.clamp(-20.0, 20.0) * m).sum(-1, keepdim=True).clamp(math.log(1e-8), 20.0)
    nonneg = adv >= 0
    k = torch.where(nonneg, torch.full_like(adv, k_pos), torch.full_like(adv, k_neg))
    lam = torch.where(nonneg, torch.full_like(adv, lambda_pos), torch.full_like(adv, lambda_neg)).clamp(min=1e-4)
    phi = torch.exp(lam * (1 - torch.exp(log_w)) + k * log_w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    w = torch.exp(log_w).expand_as(logp)
    zero = torch.zeros_like(logp, dtype=torch.bool)
    stats = ratio_stats(w, zero, zero)
    stats["vespo/phi_mean"] = phi.detach()
    return LossOutput(-phi * adv * logp, stats)
