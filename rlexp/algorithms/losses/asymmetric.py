"""Asymmetric importance weights for positive and negative tokens: ASPO ("ASPO: Asymmetric Importance Sampling
Policy Optimization", Wang et al., 2025; arXiv 2510.06062)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES


def high_entropy_tokens(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """(N, T) bool: the valid tokens whose entropy lies above their own row's ``quantile`` of the valid tokens'
    entropies (torch.nanquantile, linear interpolation), as the released ASPO code splits each response."""
    valid = mask.bool()
    ent = entropy.detach().float().masked_fill(~valid, float("nan"))
    q = torch.nanquantile(ent, quantile, dim=-1, keepdim=True)
    return (ent > q) & valid


@LOSSES.register
def aspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float = 3.0,
    dual_clip_pos: float | None = None,
    high_entropy_eps_low: float | None = None,
    high_entropy_eps_high: float | None = None,
    entropy_quantile: float = 0.8,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """ASPO: the importance ratio of positive-advantage tokens is flipped, and both signs get a soft dual clip.

    With r = π/π_old, the gradient of each token is −w·A·∇log π with
      A < 0: w = r inside the clip (r ≥ 1 − ε_low), 0 below it (PPO's lower clip), and w = c (not 0: soft dual
             clip) once r > c;
      A ≥ 0: w = 1/r inside the clip (r ≤ 1 + ε_high), 0 above it (PPO's upper clip), and w = c_pos once 1/r > c_pos.
    A positive token whose probability fell (r < 1) is pushed up harder and one already raised is damped — the
    opposite of the plain ratio, which over-weights tokens whose probability already rose. Values as the
    released code: −A·clip(r, min=1 − ε_low) for negatives, −A/clip(r, max=1 + ε_high) for positives (written
    p/sg(p)/sg(p), gradient −A·∇log π / r), −sg(c)·A·log π on dual-clipped tokens.

    ``high_entropy_eps_low/high`` (the released code's 0.4/0.4, Archer's dual-token constraint): tokens above
    their response's ``entropy_quantile`` (0.8) of token entropy take these wider bounds, the rest ε_low/ε_high;
    null: one pair for every token. No log-ratio clamp (the released code clamps at ±20). Stats:
    ``aspo/dual_clip_pos_frac``, ``aspo/dual_clip_neg_frac`` and ``aspo/weight_mean`` (w per token), with the clip
    stats. Released code: wizard-III/Archer2.0 ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_archer``."""
    c_pos = dual_clip if dual_clip_pos is None else dual_clip_pos
    if dual_clip <= 1 or c_pos <= 1:
        raise ValueError(f"ASPO's dual clips must be > 1, got {dual_clip} and {c_pos}")
    adv = expand_like(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    lo = torch.full_like(ratio, 1 - eps_low)
    hi = torch.full_like(ratio, 1 + eps_high)
    if high_entropy_eps_low is not None or high_entropy_eps_high is not None:
        if entropy is None:
            raise ValueError("aspo with high_entropy_eps_* needs token entropies")
        wide = high_entropy_tokens(entropy, mask, entropy_quantile)
        if high_entropy_eps_low is not None:
            lo = torch.where(wide, torch.full_like(lo, 1 - high_entropy_eps_low), lo)
        if high_entropy_eps_high is not None:
            hi = torch.where(wide, torch.full_like(hi, 1 + high_entropy_eps_high), hi)
    neg = adv < 0
    # negative tokens: PPO's lower clip, then a soft dual clip at c
    r_neg = torch.clamp(ratio, min=lo)
    dual_neg = neg & (r_neg.detach() > dual_clip)
    loss_neg = torch.where(dual_neg, -adv * dual_clip * logp, -adv * r_neg)
    # positive tokens: PPO's upper clip on the flipped ratio 1/r, then a soft dual clip at c_pos
    r_pos = torch.clamp(ratio, max=hi)
    inv = 1.0 / r_pos.detach()
    dual_pos = ~neg & (inv > c_pos)
    loss_pos = torch.where(dual_pos, -adv * c_pos * logp, -adv * (r_pos / r_pos.detach()) * inv)
    loss = torch.where(neg, loss_neg, loss_pos)
    with torch.no_grad():
        r = ratio.detach()
        weight = torch.where(
            neg,
            torch.where(dual_neg, torch.full_like(r, dual_clip), torch.where(r >= lo, r, torch.zeros_like(r))),
            torch.where(dual_pos, torch.full_like(r, c_pos), torch.where(r <= hi, 1.0 / r, torch.zeros_like(r))),
        )
    stats = ratio_stats(ratio, neg & (ratio < lo), ~neg & (adv > 0) & (ratio > hi))
    stats["aspo/dual_clip_pos_frac"] = dual_pos.float()
    stats["aspo/dual_clip_neg_frac"] = dual_neg.float()
    stats["aspo/weight_mean"] = weight
    return LossOutput(loss, stats)
