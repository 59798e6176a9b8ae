"""Regressing the ratio onto the bounded-ratio optimum: GBPO, the group-relative form of Bounded Policy Optimization
("Bounded Ratio Reinforcement Learning", Ao et al., 2026; arXiv 2604.18578)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats, uses_batch_extras
from rlexp.core.registry import LOSSES

TARGET = "gbpo_target"  # batch.extras key: the per-completion target signal (rlexp.algorithms.advantages.median.gbpo)


def target_ratio(target: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """The soft bounded-ratio optimum 1 − ε_low + (ε_low + ε_high)·σ(target): 1 + ε_high for a completion well above
    its group's median, 1 − ε_low well below, 1 at the median. (BRRL's analytic optimum is (1 ± ε)·π_old by the sign
    of the median advantage; the sigmoid of a tempered signal is its released smooth form.)"""
    return 1.0 - eps_low + (eps_low + eps_high) * torch.sigmoid(target)


@LOSSES.register
@uses_batch_extras(TARGET)
def gbpo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    gbpo_target: torch.Tensor | None = None,
    eps_low: float = 0.3,
    eps_high: float = 0.3,
) -> LossOutput:
    """GBPO: no clip; the ratio r = π/π_old of every token is regressed onto its completion's target ratio
    (``target_ratio`` of ``batch.extras["gbpo_target"]``, set by the ``gbpo`` advantage estimator) with an L1 loss
    weighted by the advantage's size, ℓ = |r − r*|·|A|. The gradient, sign(r − r*)·|A|·r·∇log π, pushes r towards r*
    from either side and vanishes once it is there, so the update stays inside [1 − ε_low, 1 + ε_high] without
    a clip. Stats: ``gbpo/target_ratio`` and ``gbpo/abs_gap`` |r − r*|, and ``clip/region_frac``, the share of
    tokens with r outside [1 − ε_low, 1 + ε_high] (the released pg_clipfrac). No log-ratio clamp (the released
    code clamps at ±20). Released code: bounded-ratio-rl/bounded_ratio_rl ``src/verl/trainer/ppo/core_algos.py``,
    ``compute_policy_loss_gbpo``."""
    if gbpo_target is None:
        raise ValueError("gbpo needs batch.extras['gbpo_target']: use the advantage estimator advantages.median.gbpo")
    adv = expand_like(advantages, logp).detach()
    target = target_ratio(expand_like(gbpo_target.to(logp.dtype), logp), eps_low, eps_high)
    ratio = torch.exp(logp - old_logp)
    loss = torch.abs((ratio - target) * adv)
    stats = ratio_stats(ratio, ratio < 1 - eps_low, ratio > 1 + eps_high)
    stats.update({"gbpo/target_ratio": target.detach(), "gbpo/abs_gap": (ratio - target).abs().detach()})
    return LossOutput(loss, stats)
