"""Explicit baselines: ReMax's greedy completion and OPO's length-weighted optimal baseline."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_index, group_sum


@ADVANTAGES.register
def remax(batch: RolloutBatch, key: str = "greedy_reward") -> torch.Tensor:
    """ReMax ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models", 2023): A = r − r(greedy completion of the same prompt). The greedy reward
    is produced by the ``greedy_baseline`` group stage into ``batch.extras[key]``."""
    if key not in batch.extras:
        raise KeyError(
            f"advantage remax needs batch.extras[{key!r}]: add the group stage "
            "rlexp.algorithms.group_stages.baselines.greedy_baseline to algorithm.group_stages"
        )
    return batch.reward.float() - batch.extras[key].float().to(batch.reward.device)


@ADVANTAGES.register
def opo(batch: RolloutBatch) -> torch.Tensor:
    """Length-weighted optimal baseline (OPO; "On-Policy RL with Optimal Reward Baseline", 2025):
    b_g = Σ_i l_i r_i / Σ_i l_i over the group, A = r − b_g (verl's ``opo``). Singleton groups and
    groups whose completions are all empty get advantage 0."""
    inv, k = group_index(batch.group_ids)
    r, l = batch.reward.float(), batch.lengths.float()
    num, den = group_sum(l * r, inv, k), group_sum(l, inv, k)
    count = group_sum(torch.ones_like(r), inv, k)
    base = num / den.clamp(min=1e-12)
    adv = r - base[inv]
    return torch.where((count[inv] > 1) & (den[inv] > 0), adv, torch.zeros_like(adv))
