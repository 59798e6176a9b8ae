"""Leave-one-out baselines (RLOO)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import check_singleton
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_stats


@ADVANTAGES.register
def rloo(batch: RolloutBatch, singleton: str = "zero") -> torch.Tensor:
    """Leave-one-out baseline (RLOO; "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", 2024): A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean_g).
    A singleton group has no peer: advantage 0 (``singleton=zero``; verl's ``rloo_vectorized``) or its raw
    reward (``raw``; verl's ``rloo``)."""
    check_singleton(singleton)
    mean, _, count = group_stats(batch.reward, batch.group_ids)
    adv = (batch.reward.float() - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, batch.reward.float() if singleton == "raw" else torch.zeros_like(adv))
