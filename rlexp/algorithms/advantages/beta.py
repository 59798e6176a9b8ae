"""BNPO's Beta-normalised advantages."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import batch_mean, batch_std, group_index, group_sum


@ADVANTAGES.register
def bnpo(
    batch: RolloutBatch,
    min_value: float = 0.0,
    max_value: float = 1.0,
    max_weight: float = 1e6,
    decompose: bool = False,
) -> torch.Tensor:
    """BNPO ("BNPO: Beta Normalization Policy Optimization", 2025), as in its released code: rewards
    are mapped to [0, 1] by (r − min)/(max − min); p_g is the group mean; a Beta(α, β) is fitted to the
    batch's p_g by moments (mean μ, unbiased variance v; a = (μ(1−μ)/v − 1)·μ, b = (…)·(1−μ)) and
    damped: α = max(1 + a/3, 1), β = max(1 + b/3, 1); A_i = (r_i − p_g) / Beta.pdf(p_g; α, β), the
    weight 1/pdf clamped to [0, ``max_weight``]. ``decompose`` applies it to each reward term
    separately and averages them weighted by the reward weights, Σ w_j·A_j / Σ w_j (the paper's advantage
    decomposition; the released code sums accuracy and format with weight 1 each, where this is the plain
    mean). Our choice where the code is undefined: a batch with one group or zero variance of p_g uses
    α = β = 1 (weight 1)."""
    if not decompose:
        return _bnpo_one(batch.reward, batch.group_ids, min_value, max_value, max_weight)
    if batch.rewards is None:
        raise ValueError("advantage bnpo decompose=true needs batch.rewards (per-term scores)")
    cols = [
        _bnpo_one(batch.rewards[:, j], batch.group_ids, min_value, max_value, max_weight)
        for j in range(batch.rewards.shape[1])
    ]
    w = batch.reward_weights.float().to(cols[0].device) if batch.reward_weights is not None else None
    if w is None or float(w.sum()) <= 0:
        return torch.stack(cols, 0).mean(0)
    return (torch.stack(cols, 0) * w[:, None]).sum(0) / w.sum()


def _bnpo_one(reward, group_ids, min_value, max_value, max_weight):
    if max_value <= min_value:
        raise ValueError(f"advantage bnpo: max_value={max_value} must be > min_value={min_value}")
    s = (reward.float() - min_value) / (max_value - min_value)
    if ((s < -1e-6) | (s > 1 + 1e-6)).any():
        raise ValueError(f"advantage bnpo: rewards fall outside [min_value={min_value}, max_value={max_value}]")
    s = s.clamp(0.0, 1.0)
    inv, k = group_index(group_ids)
    count = group_sum(torch.ones_like(s), inv, k)
    pg = torch.where(
        count > 1, group_sum(s, inv, k) / count, torch.zeros_like(count)
    )  # singleton: p = 0 (released code)
    p = pg[inv]
    alpha = beta = torch.tensor(1.0, device=s.device)
    mu, var = batch_mean(pg), batch_std(pg) ** 2  # over every process's groups in a distributed step
    if var > 0:  # (fewer than two groups: var 0, the uniform prior)
        common = mu * (1 - mu) / var - 1
        alpha = torch.clamp(1 + common * mu / 3, min=1.0)
        beta = torch.clamp(1 + common * (1 - mu) / 3, min=1.0)
    pdf = torch.distributions.Beta(alpha, beta).log_prob(p.clamp(0.0, 1.0)).exp()
    weight = torch.clamp(1.0 / pdf, min=0.0, max=max_weight)
    return weight * (s - p)
