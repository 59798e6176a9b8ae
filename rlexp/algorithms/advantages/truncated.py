"""Extended Generalized Advantage Estimation (EGAE) of T-PPO ("Truncated Proximal Policy Optimization", 2025,
arXiv 2506.15050): GAE on responses that the generation window cut off before they finished.

A finished row is plain GAE (the outcome reward at its last token, V after it 0). A truncated row
(``batch.truncated``: no EOS within the window) has no outcome yet: its trajectory is not over, so instead of a
terminal reward the value after its last generated token is bootstrapped. The state after the last token was never
scored by the critic (its column would be one past the window), so EGAE takes V(s_l) ≈ V(s_{l−1}), the value at the
last generated token: δ_{l−1} = r_{l−1} + γ·V(s_{l−1}) − V(s_{l−1}), and A_t = Σ_k (γλ)^k δ_{t+k} over the window's
tokens as in GAE. The policy then trains on the partial response with these advantages.

The value model learns only from finished rows (critic option ``finished_only``): their returns are the targets
computed with ``critic_lam`` (1.0: Monte-Carlo returns of the finished response, as the paper's value model is
trained on complete responses), stored in ``batch.extras["returns"]`` as ``gae`` does.

Metrics (``batch.stats``): ``t_ppo/truncated_frac`` (rows cut by the window), ``t_ppo/bootstrap_value_mean`` (mean
bootstrapped V over the truncated rows), ``t_ppo/critic_rows`` (finished rows the critic may train on).
"""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.reinforce import token_level_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten


def bootstrapped_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, bootstrap: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """(N, T) GAE advantages where the value after each row's last valid token is ``bootstrap`` (N,) instead of 0;
    masked positions pass V and A through (as :func:`~rlexp.algorithms.advantages.gae.gae`)."""
    N, T = mask.shape
    adv = torch.zeros_like(values)
    next_value = bootstrap.float().clone()
    running = torch.zeros(N, device=values.device)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * m + running * (1 - m)
        next_value = values[:, t] * m + next_value * (1 - m)
        adv[:, t] = running * m
    return adv


@ADVANTAGES.register
def egae(
    batch: RolloutBatch,
    gamma: float = 1.0,
    lam: float = 0.95,
    critic_lam: float = 1.0,
    whiten: bool = True,
    eps: float = 1e-8,
    reward_truncated: bool = False,
) -> torch.Tensor:
    """EGAE (module docstring). ``lam``: λ of the policy's advantages; ``critic_lam``: λ of the returns the value
    model regresses on (finished rows only); ``reward_truncated``: also pay a truncated row's outcome reward (the
    score of its partial response) at its last token besides the bootstrap (False: the paper — an unfinished
    response has no reward yet). ``whiten`` standardises A over all valid tokens. Returns (N, T)."""
    if batch.values is None:
        raise ValueError("advantage egae needs batch.values: configure algorithm.critic")
    for key, v in (("gamma", gamma), ("lam", lam), ("critic_lam", critic_lam)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"algorithm.advantage.{key}={v} must be in [0, 1]")
    mask = batch.completion_mask.float()
    values = batch.values.float() * mask
    N = mask.shape[0]
    truncated = batch.truncated.to(mask.device).bool() & (mask.sum(-1) > 0)
    rewards = token_level_rewards(batch, outcome_reward=True)
    if not reward_truncated and bool(truncated.any()):
        rewards = torch.where(truncated[:, None], token_level_rewards(batch, outcome_reward=False), rewards)
    last = (mask.sum(-1) - 1).clamp(min=0).long()
    v_last = values[torch.arange(N, device=mask.device), last]
    bootstrap = torch.where(truncated, v_last, torch.zeros_like(v_last))  # V(s_l) ≈ V(s_{l-1}); 0 after an EOS
    adv = bootstrapped_gae(rewards, values, mask, bootstrap, gamma, lam)
    critic_adv = adv if critic_lam == lam else bootstrapped_gae(rewards, values, mask, bootstrap, gamma, critic_lam)
    batch.extras["returns"] = (critic_adv + values) * mask
    n_trunc = int(truncated.sum())
    batch.stats["t_ppo/truncated_frac"] = n_trunc / max(N, 1)
    batch.stats["t_ppo/bootstrap_value_mean"] = float(v_last[truncated].mean()) if n_trunc else 0.0
    batch.stats["t_ppo/critic_rows"] = float(int((~batch.truncated.bool()).sum()))
    if whiten:
        adv = masked_whiten(adv, mask, eps) * mask
    return adv


egae.token_rewards = True  # consumes batch.extras["token_rewards"] (Algorithm.compute_advantages)
