"""Generalized Advantage Estimation on the critic's values (PPO)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.reinforce import token_level_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten


@ADVANTAGES.register
def gae(
    batch: RolloutBatch,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
    eps: float = 1e-8,
    outcome_reward: bool = True,
) -> torch.Tensor:
    """Generalized Advantage Estimation ("High-Dimensional Continuous Control Using Generalized
    Advantage Estimation", 2016) as used by PPO for LMs, on the token-level rewards r_t
    (:func:`~rlexp.algorithms.advantages.reinforce.token_level_rewards`: the outcome reward at the last valid
    token, the KL-in-reward penalty β·KL_t at each token as InstructGPT and verl charge it, process rewards in
    ``batch.extras["token_rewards"]``); V after the last token is 0; δ_t = r_t + γV_{t+1} − V_t,
    A_t = Σ_k (γλ)^k δ_{t+k}, a masked position passing V and A through (verl's
    ``compute_gae_advantage_return``). Needs
    ``batch.values`` (N, T) from the critic's stage; stores the returns A + V (before whitening) in
    ``batch.extras["returns"]`` for the value loss. ``whiten`` standardises A over all valid tokens
    (verl). ``outcome_reward=False`` leaves the outcome out of r_t (DVPO: the frozen global value model's values
    carry the reward signal; r_t = −β·KL_t + process rewards). Returns (N, T)."""
    if batch.values is None:
        raise ValueError("advantage gae needs batch.values: configure algorithm.critic")
    mask = batch.completion_mask.float()
    values = batch.values.float() * mask
    N, T = mask.shape
    rewards = token_level_rewards(batch, outcome_reward)
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


gae.token_rewards = True  # consumes batch.extras["token_rewards"] (Algorithm.compute_advantages)
