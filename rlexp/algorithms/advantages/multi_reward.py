"""Multi-reward advantages: GDPO normalises each reward term within its group before summing."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES


@ADVANTAGES.register
def gdpo(
    batch: RolloutBatch, eps: float = 1e-6, batch_normalize: bool = True, single_term_grpo: bool = True
) -> torch.Tensor:
    """GDPO ("GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL",
    2026): each reward term is normalised within its group, z_ik = (r_ik − mean_gk)/(std_gk + ε), the
    weighted sum Σ_k w_k z_ik is then standardised over the batch (TRL's ``normalize_then_sum``: per
    sequence, Bessel std, ε added to the std; verl whitens over tokens instead). A singleton group's
    z is 0. With one reward term there is nothing to decouple: ``single_term_grpo`` falls back to GRPO's
    group-normalised advantage, as the official code does (no batch standardisation)."""
    if batch.rewards is None or batch.reward_weights is None:
        raise ValueError("advantage gdpo needs batch.rewards (N, R) and batch.reward_weights")
    if single_term_grpo and batch.rewards.shape[1] == 1:
        return normalize_rewards(batch.reward, batch.group_ids, "group", eps)
    z = torch.stack(
        [normalize_rewards(batch.rewards[:, j], batch.group_ids, "group", eps) for j in range(batch.rewards.shape[1])],
        1,
    )
    total = z @ batch.reward_weights.float().to(z.device)
    if not batch_normalize:
        return total
    if total.numel() < 2:
        return torch.zeros_like(total)
    return (total - total.mean()) / (total.std() + eps)
