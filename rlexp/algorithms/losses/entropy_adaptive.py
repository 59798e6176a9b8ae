"""A clipped surrogate whose clip bounds and advantages follow each token's entropy: HAPO's Differential Advantage
Redistribution and Asymmetric Adaptive Clipping ("From Uniform to Heterogeneous: Tailoring Policy Optimization to
Every Token's Nature", Liu et al., 2025; released code starriver030515/HAPO, ``compute_policy_loss``, ``ada_clip``,
``ada_advantage``).

ĥ ∈ [−1, 1] is the token's entropy signal (``rlexp.core.entropy``: log-entropy about the batch's 80th percentile,
scaled per side); ĥ > 0 marks an uncertain ("forking") token, ĥ < 0 a confident one.

* Asymmetric Adaptive Clipping: ε_low,t = ε_low·(1 − α·ĥ) at confident tokens (ĥ ≤ 0: a wider lower bound, their
  probability may fall further), ε_high,t = ε_high·(1 + α·ĥ) at uncertain ones (ĥ > 0: a wider upper bound, room to
  explore); the other bound stays.
* Differential Advantage Redistribution: Ã = A·(1 + β·ĥ). Inside the neutral zone 1 − ε_low,t/2 < r < 1 + ε_high,t/2
  a confident token takes Ã (its advantage damped) and an uncertain one keeps A; outside it the roles swap (an
  uncertain token whose ratio already moved gets Ã, amplified; a confident one keeps A).
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.entropy import entropy_signal
from rlexp.core.registry import LOSSES


def adaptive_clip_ranges(
    h: torch.Tensor, eps_low: float, eps_high: float, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ε_low,t, ε_high,t) per token: the lower range widened at ĥ ≤ 0, the upper one at ĥ > 0, by the factor
    1 ∓ α·ĥ (``ada_clip``)."""
    low = torch.where(h <= 0, eps_low * (1 - alpha * h), torch.full_like(h, eps_low))
    high = torch.where(h > 0, eps_high * (1 + alpha * h), torch.full_like(h, eps_high))
    return low, high


def redistributed_advantages(
    adv: torch.Tensor, h: torch.Tensor, ratio: torch.Tensor, low: torch.Tensor, high: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """HAPO's advantages per token and the factor applied to each (1 where A is kept): A·(1 + β·ĥ) for a confident
    token inside the neutral zone and an uncertain one outside it, A otherwise (``ada_advantage``)."""
    neutral = (ratio > 1 - low / 2) & (ratio < 1 + high / 2)
    scaled = torch.where(h > 0, ~neutral, neutral)
    factor = torch.where(scaled, 1 + beta * h, torch.ones_like(h))
    return adv * factor, factor


@LOSSES.register
def hapo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = 10.0,
    pivot: float = 0.8,
    adaptive_clip: bool = True,
    clip_alpha: float = 1.0,
    adaptive_advantage: bool = True,
    adv_beta: float = 1.0,
    released_sign: bool = False,
) -> LossOutput:
    """HAPO's policy loss: the PPO clipped surrogate with per-token bounds (``adaptive_clip``, strength α =
    ``clip_alpha``) on advantages redistributed by entropy and ratio (``adaptive_advantage``, strength β =
    ``adv_beta``), with verl's dual clip c (``dual_clip``; the release's recipes: 10). ĥ comes from the current
    token entropies of the micro-batch being differentiated, with that micro-batch's statistics (as the release:
    verl's per-micro-batch loss call); ``pivot`` is the quantile that splits ĥ's sign (0.8). ``released_sign``:
    the release's scaling of the low-entropy side, which makes ĥ ≥ 0 everywhere (see ``rlexp.core.entropy``).
    Metrics: ``hapo/clip_low``, ``hapo/clip_high`` (the mean bounds ε), ``hapo/advantage_factor`` (the mean
    factor on the advantage), ``hapo/high_entropy_frac`` (tokens with ĥ > 0), and the PPO clip/ratio metrics."""
    if eps_low < 0 or eps_high < 0 or clip_alpha < 0 or adv_beta < 0:
        raise ValueError(
            f"algorithm.loss (hapo_clip): eps_low={eps_low}, eps_high={eps_high}, clip_alpha={clip_alpha}, "
            f"adv_beta={adv_beta} must all be >= 0"
        )
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"algorithm.loss.dual_clip must be > 1 or null, got {dual_clip}")
    adv = expand_like(advantages, logp).float()
    with torch.no_grad():
        h = entropy_signal(entropy.detach(), mask, pivot, released_sign=released_sign)
        ratio_ng = torch.exp(logp.detach() - old_logp)
        if adaptive_clip:
            low, high = adaptive_clip_ranges(h, eps_low, eps_high, clip_alpha)
        else:
            low, high = torch.full_like(h, eps_low), torch.full_like(h, eps_high)
        factor = torch.ones_like(h)
        if adaptive_advantage:
            adv, factor = redistributed_advantages(adv, h, ratio_ng, low, high, adv_beta)
    ratio = torch.exp(logp - old_logp)
    lo, hi = 1 - low, 1 + high
    surrogate = torch.maximum(-adv * ratio, -adv * torch.minimum(torch.maximum(ratio, lo), hi))
    loss = surrogate
    stats: dict[str, torch.Tensor] = {}
    if dual_clip is not None:  # verl's dual clip: a negative-advantage token's loss is at most c·|A|
        capped = torch.minimum(surrogate, -adv * dual_clip)
        stats["clip/dual_frac"] = ((surrogate > -adv * dual_clip) & (adv < 0)).float()
        loss = torch.where(adv < 0, capped, surrogate)
    low_hit = ((ratio_ng < lo) & (adv < 0)).float()
    high_hit = ((ratio_ng > hi) & (adv > 0)).float()
    stats.update(
        {
            "clip/low_frac": low_hit,
            "clip/high_frac": high_hit,
            "clip/region_frac": torch.clamp(low_hit + high_hit, max=1),
            "ratio/mean": ratio_ng,
            "hapo/clip_low": low,
            "hapo/clip_high": high,
            "hapo/advantage_factor": factor,
            "hapo/high_entropy_frac": (h > 0).float(),
        }
    )
    return LossOutput(loss, stats)
