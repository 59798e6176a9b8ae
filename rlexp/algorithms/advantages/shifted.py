"""Group baselines that are not the plain mean: AsymRE's shifted mean and OPMD's log-average-exp ("Group-
Relative REINFORCE is Secretly an Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends",
Yao et al., 2025; as released in Trinity-RFT's ``asymre`` and ``opmd`` advantage functions)."""

from __future__ import annotations

import math

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_index, group_stats

BASELINES = ("mean", "logavgexp")


@ADVANTAGES.register
def shifted_baseline(batch: RolloutBatch, baseline: str = "mean", shift: float = 0.0, tau: float = 1.0) -> torch.Tensor:
    """A = r − (b_g + ``shift``) with b_g the group's mean reward (``mean``) or τ·log mean exp(r/τ)
    (``logavgexp``, OPMD's soft-max baseline: between the mean (τ → ∞) and the max (τ → 0)). A negative
    ``shift`` lowers the baseline, so positive samples weigh more than negative ones (AsymRE: −0.1).
    A group of one has baseline 0, as released (its advantage is its reward)."""
    if baseline not in BASELINES:
        raise ValueError(f"advantage shifted_baseline baseline={baseline!r} is not one of {list(BASELINES)}")
    if baseline == "logavgexp" and tau <= 0:
        raise ValueError(f"advantage shifted_baseline tau={tau} must be > 0")
    r = batch.reward.float()
    if baseline == "mean":
        mean, _, count = group_stats(r, batch.group_ids)
        return r - torch.where(count > 1, mean + shift, torch.zeros_like(mean))
    inv, k = group_index(batch.group_ids)
    base = torch.zeros(k, dtype=r.dtype, device=r.device)
    for g in range(k):
        values = r[inv == g]
        if values.numel() > 1:
            base[g] = tau * (torch.logsumexp(values / tau, 0) - math.log(values.numel())) + shift
    return r - base[inv]
