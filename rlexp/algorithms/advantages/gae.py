"""Generalized Advantage Estimation on the critic's values (PPO)."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten


@ADVANTAGES.register
def gae(
    batch: RolloutBatch, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Generalized Advantage Estimation ("High-Dimensional Continuous Control Using Generalized
    Advantage Estimation", 2016) as used by PPO for LMs: the outcome reward is paid at the last valid
    token; V after the last token is 0; δ_t = r_t + γV_{t+1} − V_t, A_t = Σ_k (γλ)^k δ_{t+k}. Needs
    ``batch.values`` (N, T) from the critic's stage; stores the returns A + V (before whitening) in
    ``batch.extras["returns"]`` for the value loss. ``whiten`` standardises A over all valid tokens
    (verl). Returns (N, T)."""
    if batch.values is None:
        raise ValueError("advantage gae needs batch.values: configure algorithm.critic")
    mask = batch.completion_mask.float()
    values = batch.values.float() * mask
    N, T = mask.shape
    last = (mask.sum(-1) - 1).clamp(min=0).long()
    rewards = torch.zeros_like(values)
    has_tokens = mask.sum(-1) > 0
    rewards[torch.arange(N, device=mask.device)[has_tokens], last[has_tokens]] = batch.reward.float()[has_tokens]
    adv = torch.zeros_like(values)
    next_value = torch.zeros(N, device=values.device)
    running = torch.zeros(N, device=values.device)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * m + running * (1 - m)
        next_value = values[:, t] * m + next_value * (1 - m)
        adv[:, t] = running * m
    batch.extras["returns"] = (adv + values) * mask
    if whiten:
        adv = masked_whiten(adv, mask, eps) * mask
    return adv
