"""Median-relative signals: GBPO's target beside the GRPO advantage ("Bounded Ratio Reinforcement Learning", 2026)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_stats

TARGET = "gbpo_target"  # read by rlexp.algorithms.losses.bounded_ratio.gbpo


def group_median(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(N,) the median of each row's group (torch.quantile at 0.5: an even group's two middle values averaged)."""
    v = values.float()
    out = torch.empty_like(v)
    for g in torch.unique(group_ids):
        rows = group_ids == g
        out[rows] = torch.quantile(v[rows], 0.5)
    return out


@ADVANTAGES.register
def gbpo(batch: RolloutBatch, eps: float = 1e-6, temperature: float = 1e-4, scale_by_std: bool = True) -> torch.Tensor:
    """GBPO's two signals (released code: ``compute_gbpo_outcome_advantage_and_target``): the GRPO advantage
    (r − mean_g)/(std_g + ε), returned, which only weights GBPO's loss; and the target signal
    (r − median_g)/(std_g + ε)/temperature, stored in ``batch.extras["gbpo_target"]`` for the ``gbpo`` loss, which
    maps it to a target ratio — BRRL's optimum moves the probability of a completion above its group's median up to
    (1 + ε)·π_old and one below it down to (1 − ε)·π_old. ``scale_by_std=false``: no std division in either
    (verl's norm_adv_by_std_in_grpo). A singleton group gets advantage and target 0 (our convention; the released
    code passes the raw reward through). Stats: ``gbpo/above_median_frac``, ``gbpo/below_median_frac``."""
    if temperature <= 0:
        raise ValueError(f"advantage gbpo.temperature must be > 0, got {temperature}")
    r = batch.reward.float()
    adv = normalize_rewards(batch.reward, batch.group_ids, scale="group" if scale_by_std else "none", eps=eps)
    _, std, count = group_stats(batch.reward, batch.group_ids)
    centred = r - group_median(r, batch.group_ids)
    target = centred / (std + eps) if scale_by_std else centred
    target = torch.where(count > 1, target / temperature, torch.zeros_like(target))
    batch.extras[TARGET] = target
    batch.stats["gbpo/above_median_frac"] = float((centred[count > 1] > 0).float().mean()) if (count > 1).any() else 0.0
    batch.stats["gbpo/below_median_frac"] = float((centred[count > 1] < 0).float().mean()) if (count > 1).any() else 0.0
    return adv
