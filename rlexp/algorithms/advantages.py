"""Advantage estimators: ``estimator(batch) -> advantages`` of shape (N,) or (N, T).

Conventions (see ../shared/reference/conventions.md; chosen on purpose):

* Group statistics are computed in float32 with the unbiased (n-1, Bessel) standard deviation and
  ``eps`` added to the std, not under the root. ``eps`` defaults to 1e-6 (verl); TRL uses 1e-4 —
  set ``eps: 1.0e-4`` to reproduce TRL exactly.
* A singleton group (one completion) has no peer baseline: its advantage is 0 (TRL's convention;
  verl passes the raw reward through).
"""
from __future__ import annotations

import torch

from rlexp.algorithms.batch import RolloutBatch

SCALES = ("group", "batch", "none")


def group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (mean, unbiased std, group size) of ``values`` over each row's group."""
    values = values.float()
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(k, device=values.device).index_add_(0, inv, torch.ones_like(values))
    total = torch.zeros(k, device=values.device).index_add_(0, inv, values)
    mean = total / count
    sq = torch.zeros(k, device=values.device).index_add_(0, inv, (values - mean[inv]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[inv], std[inv], count[inv]


def normalize_rewards(rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group",
                      eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group-relative advantage (DeepSeekMath, 2024): (r - mean_g) / (std + eps).

    ``scale``: ``group`` divides by the group std (GRPO), ``batch`` by the std of all rewards in the
    batch ("Lite PPO": group mean, batch std; Tricks or Traps, 2025), ``none`` only centres
    (Dr. GRPO: Understanding R1-Zero-Like Training, 2025)."""
    if scale not in SCALES:
        raise ValueError(f"advantage scale={scale!r} is not one of {SCALES}")
    mean, std, count = group_stats(rewards, group_ids)
    adv = rewards.float() - mean
    if scale == "group":
        adv = adv / (std + eps)
    elif scale == "batch":
        r = rewards.float()
        batch_std = r.std() if r.numel() > 1 else torch.zeros((), device=r.device)
        adv = adv / (batch_std + eps)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


def grpo(batch: RolloutBatch, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised outcome advantage, one value per completion."""
    return normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps)
