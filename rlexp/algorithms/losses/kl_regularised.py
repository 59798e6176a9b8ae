"""RPG — "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning" (Zhang et al., 2025; arXiv
2505.17508; released code complex-reasoning/RPG, verl ``core_algos.py``): policy gradients whose KL regulariser to
the old policy (the iterative reference) is folded into the per-token weight of ∇log π.

With w = π_θ/π_old and w̄ = clip(w, 1 − ε_low, 1 + ε_high), the KL's coefficient k per token:

    fkl  (forward KL, KL(π_old ‖ π_θ))        k = β
    rkl  (reverse KL, KL(π_θ ‖ π_old))        k = −β·w̄·(log w̄ + 1)
    ufkl (unnormalised forward KL)            k = β·(1 − w̄)
    urkl (unnormalised reverse KL)            k = −β·w̄·log w̄

REINFORCE-style (``clip: false``): ℓ = −sg(A·w̄ + k)·log π_θ. RPG-style clip (``clip: true``, the recommended form):
the gradient −(A·w + k)·∇log π_θ inside the trust region — A > 0 and w < 1 + ε_high, or A ≤ 0 and 1 − ε_low ≤ w < c
(a dual-clip bound c) — and none outside it (the loss there is a constant, as the released code's sg(log π) terms).
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES

KL_TYPES = ("fkl", "rkl", "ufkl", "urkl")


def kl_coefficient(w_bar: torch.Tensor, kl_type: str, beta: float) -> torch.Tensor:
    """(…) the KL regulariser's weight k on ∇log π per token (see the module doc)."""
    if kl_type == "fkl":
        return torch.full_like(w_bar, beta)
    if kl_type == "rkl":
        return -beta * w_bar * (torch.log(w_bar) + 1.0)
    if kl_type == "ufkl":
        return beta * (1.0 - w_bar)
    if kl_type == "urkl":
        return -beta * w_bar * torch.log(w_bar)
    raise ValueError(f"algorithm.loss.kl_type={kl_type!r} is not one of {list(KL_TYPES)}")


@LOSSES.register
def rpg(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_type: str = "fkl",
    beta: float = 1e-4,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    clip: bool = True,
    clip_c: float = 10.0,
) -> LossOutput:
    """RPG's KL-regularised policy gradient (see the module doc)."""
    if kl_type not in KL_TYPES:
        raise ValueError(f"algorithm.loss.kl_type={kl_type!r} is not one of {list(KL_TYPES)}")
    if clip_c <= 1.0:
        raise ValueError(f"algorithm.loss.clip_c={clip_c} must be > 1")
    adv = expand_like(advantages, logp)
    w = torch.exp(logp - old_logp).detach()
    w_bar = w.clamp(1 - eps_low, 1 + eps_high)
    k = kl_coefficient(w_bar, kl_type, beta)
    if not clip:
        loss = -(adv * w_bar + k) * logp
        inside = torch.ones_like(w, dtype=torch.bool)
    else:
        inside = torch.where(adv > 0, w < 1 + eps_high, (w >= 1 - eps_low) & (w < clip_c))
        loss = torch.where(inside, -(adv * w + k) * logp, torch.zeros_like(logp))
    low = (w < 1 - eps_low) & (adv <= 0)
    high = (w > 1 + eps_high) & (adv > 0)
    stats = ratio_stats(w, low, high)
    stats["rpg/kl_coef_abs"] = k.abs()
    stats["rpg/outside_frac"] = (~inside).float()
    return LossOutput(loss, stats)
