"""Multi-reward advantages: GDPO normalises each reward term within its group before summing."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten


@ADVANTAGES.register
def gdpo(
    batch: RolloutBatch,
    eps: float = 1e-6,
    batch_normalize: bool = True,
    single_term_grpo: bool = True,
    batch_level: str = "sequence",
) -> torch.Tensor:
    """GDPO ("GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL",
    2026): each reward term is normalised within its group, z_ik = (r_ik − mean_gk)/(std_gk + ε), the
    weighted sum Σ_k w_k z_ik is then standardised over the batch (TRL's ``normalize_then_sum``: per
    sequence, Bessel std, ε added to the std); ``batch_level="token"`` whitens over the batch's valid tokens
    instead, rsqrt(var + 1e-8), returning (N, T) (verl's ``gdpo``: longer completions weigh more). A singleton
    group's z is 0. With one reward term there is nothing to decouple: ``single_term_grpo`` falls back to GRPO's
    group-normalised advantage, as the official code does (no batch standardisation; verl still whitens:
    ``single_term_grpo=false``)."""
    if batch_level not in ("sequence", "token"):
        raise ValueError(f"algorithm.advantage.batch_level={batch_level!r} is not one of ['sequence', 'token']")
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
    if batch_level == "token":
        mask = batch.completion_mask
        return masked_whiten(total[:, None] * mask, mask) * mask
    if total.numel() < 2:
        return torch.zeros_like(total)
    return (total - total.mean()) / (total.std() + eps)
