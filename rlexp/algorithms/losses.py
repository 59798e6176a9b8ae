"""Per-token policy losses: ``loss(logp, old_logp, advantages, mask) -> LossOutput``.

``logp`` are the current policy's log-probs of the sampled tokens (N, T), ``old_logp`` those of the
policy that sampled them (equal to ``logp.detach()`` on-policy), ``advantages`` (N,) or (N, T).
Token statistics (clip indicators, ratios) come back per token so the trainer can reduce them over
the whole batch, independent of micro-batching.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    per_token: torch.Tensor                      # (N, T) loss per token, before aggregation
    token_stats: dict[str, torch.Tensor] = field(default_factory=dict)  # (N, T) values to average over the mask


def _expand(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             eps_low: float = 0.2, eps_high: float | None = None, dual_clip: float | None = None) -> LossOutput:
    """PPO clipped surrogate (Proximal Policy Optimization Algorithms, 2017) as used by GRPO
    (DeepSeekMath, 2024), with asymmetric clip-higher ε_low/ε_high (DAPO, 2025) and optional dual
    clip ``c`` that caps the loss of negative-advantage tokens at c·|A| (Dual-Clip PPO, 2019).
    No log-ratio clamp (TRL's convention)."""
    eps_high = eps_low if eps_high is None else eps_high
    adv = _expand(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(adv < 0, torch.min(loss, -dual_clip * adv), loss)
    low = ((ratio < 1 - eps_low) & (adv < 0)).float()
    high = ((ratio > 1 + eps_high) & (adv > 0)).float()
    stats = {"clip/low_frac": low, "clip/high_frac": high, "clip/region_frac": torch.clamp(low + high, max=1),
             "ratio/mean": ratio.detach()}
    return LossOutput(loss, stats)
