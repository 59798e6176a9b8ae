"""Advantage estimators: ``estimator(batch) -> advantages`` of shape (N,) or (N, T).

Conventions (see ../shared/reference/conventions.md; chosen on purpose):

* Group statistics are computed in float32 with the unbiased (n-1, Bessel) standard deviation and
  ``eps`` added to the std, not under the root. ``eps`` defaults to 1e-6 (verl); TRL uses 1e-4 —
  set ``eps: 1.0e-4`` to reproduce TRL exactly.
* A singleton group (one completion) has no peer baseline: its advantage is 0 (TRL's convention;
  verl passes the raw reward through). Exceptions follow the method's released code and are named
  in the estimator's docstring (REINFORCE++-baseline and BNPO use baseline 0, like verl).
* Every row counts in its group's statistics, whatever its mask (verl); per-term reward failures
  are scored 0 by the reward stage, not left out (TRL leaves all-None rows out).
* Batch-level normalisations: ``grpo(scale=batch)`` and GDPO standardise per sequence (TRL);
  REINFORCE++ (and its baseline variant) and GAE whiten over the valid tokens with
  rsqrt(var + 1e-8), Bessel's correction on the token count (verl's ``masked_whiten``).

Estimators: grpo (group / batch / none scaling: GRPO, Lite PPO, Dr. GRPO), rloo, reinforce_pp,
reinforce_pp_baseline, remax, opo, gpg, bnpo, gdpo, gae (PPO; needs the critic), raw_reward.
The full list of conventions, with the setting that switches to the other peer's, is in
CONVENTIONS.md beside this file.
"""
from __future__ import annotations

import torch

from rlexp.algorithms.batch import RolloutBatch

SCALES = ("group", "batch", "none")


def group_stats(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (mean, unbiased std, group size) of ``values`` over each row's group."""
    values = values.float()
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(k, device=values.device).index_add_(0, inv, torch.ones_like(values))
    total = torch.zeros(k, device=values.device).index_add_(0, inv, values)
    mean = total / count
    sq = torch.zeros(k, device=values.device).index_add_(0, inv, (values - mean[inv]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return mean[inv], std[inv], count[inv]


def normalize_rewards(rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group",
                      eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group-relative advantage (DeepSeekMath, 2024): (r - mean_g) / (std + eps).

    ``scale``: ``group`` divides by the group std (GRPO), ``batch`` by the std of all rewards in the
    batch ("Lite PPO": group mean, batch std; Tricks or Traps, 2025), ``none`` only centres
    (Dr. GRPO: Understanding R1-Zero-Like Training, 2025)."""
    if scale not in SCALES:
        raise ValueError(f"advantage scale={scale!r} is not one of {SCALES}")
    mean, std, count = group_stats(rewards, group_ids)
    adv = rewards.float() - mean
    if scale == "group":
        adv = adv / (std + eps)
    elif scale == "batch":
        r = rewards.float()
        batch_std = r.std() if r.numel() > 1 else torch.zeros((), device=r.device)
        adv = adv / (batch_std + eps)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


def grpo(batch: RolloutBatch, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised outcome advantage, one value per completion."""
    return normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps)


# ---- helpers ---------------------------------------------------------------------------------------

def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) · rsqrt(var + eps) over the valid tokens, var with Bessel's correction over the token
    count (verl's ``masked_whiten``). Fewer than two valid tokens: the variance is taken as 0."""
    values, m = values.float(), mask.float()
    count = m.sum()
    mean = (values * m).sum() / count.clamp(min=1)
    var = (((values - mean) ** 2) * m).sum() / (count - 1).clamp(min=1)
    if count < 2:
        var = torch.zeros_like(var)
    return (values - mean) * torch.rsqrt(var + eps)


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    _, inv = torch.unique(group_ids, return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def _group_sum(values: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    return torch.zeros(k, device=values.device, dtype=values.dtype).index_add_(0, inv, values)


def _token_returns(reward: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return at each valid token of an outcome reward paid at the last valid token:
    G_t = γ^(L−1−t)·R for t < L (zero on padding)."""
    m = mask.float()
    lengths = m.sum(-1, keepdim=True)
    t = torch.arange(mask.shape[1], device=mask.device, dtype=torch.float32)[None, :]
    steps_to_end = (lengths - 1 - t).clamp(min=0)
    return reward.float()[:, None] * torch.pow(torch.tensor(float(gamma), device=mask.device), steps_to_end) * m


# ---- outcome-reward estimators ---------------------------------------------------------------------

def rloo(batch: RolloutBatch) -> torch.Tensor:
    """Leave-one-out baseline (RLOO; "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", 2024): A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean_g).
    A singleton group has no peer: advantage 0 (verl's ``rloo_vectorized``)."""
    mean, _, count = group_stats(batch.reward, batch.group_ids)
    adv = (batch.reward.float() - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


def reinforce_pp(batch: RolloutBatch, gamma: float = 1.0, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ ("REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    2025): the (discounted) return of the outcome reward at every token, whitened over all valid tokens
    of the batch (global batch normalisation; verl's ``reinforce_plus_plus``). Returns (N, T).
    The KL penalty the paper puts into the reward is the trainer's ``algorithm.kl.mode=reward``."""
    returns = _token_returns(batch.reward, batch.completion_mask, gamma)
    return masked_whiten(returns, batch.completion_mask, eps) * batch.completion_mask


def reinforce_pp_baseline(batch: RolloutBatch, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++-baseline (same paper, group variant): subtract the group mean reward, then whiten
    over all valid tokens of the batch (longer completions weigh more; verl's
    ``reinforce_plus_plus_baseline``). A singleton group uses baseline 0 (verl). Returns (N, T)."""
    mean, _, count = group_stats(batch.reward, batch.group_ids)
    centred = batch.reward.float() - torch.where(count > 1, mean, torch.zeros_like(mean))
    tokens = centred[:, None] * batch.completion_mask.float()
    return masked_whiten(tokens, batch.completion_mask, eps) * batch.completion_mask


def remax(batch: RolloutBatch, key: str = "greedy_reward") -> torch.Tensor:
    """ReMax ("ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models", 2023): A = r − r(greedy completion of the same prompt). The greedy reward
    is produced by the ``greedy_baseline`` group stage into ``batch.extras[key]``."""
    if key not in batch.extras:
        raise KeyError(f"advantage remax needs batch.extras[{key!r}]: add the group stage "
                       "rlexp.algorithms.group_stages.greedy_baseline to algorithm.group_stages")
    return batch.reward.float() - batch.extras[key].float().to(batch.reward.device)


def opo(batch: RolloutBatch) -> torch.Tensor:
    """Length-weighted optimal baseline (OPO; "On-Policy RL with Optimal Reward Baseline", 2025):
    b_g = Σ_i l_i r_i / Σ_i l_i over the group, A = r − b_g (verl's ``opo``). Singleton groups and
    groups whose completions are all empty get advantage 0."""
    inv, k = _group_index(batch.group_ids)
    r, l = batch.reward.float(), batch.lengths.float()
    num, den = _group_sum(l * r, inv, k), _group_sum(l, inv, k)
    count = _group_sum(torch.ones_like(r), inv, k)
    base = num / den.clamp(min=1e-12)
    adv = r - base[inv]
    return torch.where((count[inv] > 1) & (den[inv] > 0), adv, torch.zeros_like(adv))


def gpg(batch: RolloutBatch, scale: str = "none", eps: float = 1e-6, min_valid_frac: float = 0.05) -> torch.Tensor:
    """GPG ("GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning", 2025):
    the group-relative advantage (``scale`` as in :func:`normalize_rewards`) multiplied by
    α = B / M, where M counts the completions in groups with non-zero reward variance — the gradient
    of the zero-advantage groups is redistributed to the rest. As in the released code, α is capped
    at 1 / ``min_valid_frac`` (their ``max(1 − invalid_frac, 0.05)``). (verl's ``gpg`` instead counts
    completions with a non-zero reward.)"""
    adv = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps)
    _, std, count = group_stats(batch.reward, batch.group_ids)
    valid_frac = float(((std > 0) & (count > 1)).float().mean()) if len(batch) else 1.0
    return adv / max(valid_frac, min_valid_frac)


def bnpo(batch: RolloutBatch, min_value: float = 0.0, max_value: float = 1.0, max_weight: float = 1e6,
         decompose: bool = False) -> torch.Tensor:
    """BNPO ("BNPO: Beta Normalization Policy Optimization", 2025), as in its released code: rewards
    are mapped to [0, 1] by (r − min)/(max − min); p_g is the group mean; a Beta(α, β) is fitted to the
    batch's p_g by moments (mean μ, unbiased variance v; a = (μ(1−μ)/v − 1)·μ, b = (…)·(1−μ)) and
    damped: α = max(1 + a/3, 1), β = max(1 + b/3, 1); A_i = (r_i − p_g) / Beta.pdf(p_g; α, β), the
    weight 1/pdf clamped to [0, ``max_weight``]. ``decompose`` applies it to each reward term
    separately and averages (the paper's advantage decomposition). Our choice where the code is
    undefined: a batch with one group or zero variance of p_g uses α = β = 1 (weight 1)."""
    if not decompose:
        return _bnpo_one(batch.reward, batch.group_ids, min_value, max_value, max_weight)
    if batch.rewards is None:
        raise ValueError("advantage bnpo decompose=true needs batch.rewards (per-term scores)")
    cols = [_bnpo_one(batch.rewards[:, j], batch.group_ids, min_value, max_value, max_weight)
            for j in range(batch.rewards.shape[1])]
    return torch.stack(cols, 0).mean(0)


def _bnpo_one(reward, group_ids, min_value, max_value, max_weight):
    if max_value <= min_value:
        raise ValueError(f"advantage bnpo: max_value={max_value} must be > min_value={min_value}")
    s = (reward.float() - min_value) / (max_value - min_value)
    if ((s < -1e-6) | (s > 1 + 1e-6)).any():
        raise ValueError(f"advantage bnpo: rewards fall outside [min_value={min_value}, max_value={max_value}]")
    s = s.clamp(0.0, 1.0)
    inv, k = _group_index(group_ids)
    count = _group_sum(torch.ones_like(s), inv, k)
    pg = torch.where(count > 1, _group_sum(s, inv, k) / count, torch.zeros_like(count))  # singleton: p = 0 (released code)
    p = pg[inv]
    alpha = beta = torch.tensor(1.0, device=s.device)
    if k > 1:
        mu, var = pg.mean(), pg.var()
        if var > 0:
            common = mu * (1 - mu) / var - 1
            alpha = torch.clamp(1 + common * mu / 3, min=1.0)
            beta = torch.clamp(1 + common * (1 - mu) / 3, min=1.0)
    pdf = torch.distributions.Beta(alpha, beta).log_prob(p.clamp(0.0, 1.0)).exp()
    weight = torch.clamp(1.0 / pdf, min=0.0, max=max_weight)
    return weight * (s - p)


def gdpo(batch: RolloutBatch, eps: float = 1e-6, batch_normalize: bool = True) -> torch.Tensor:
    """GDPO ("GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL",
    2026): each reward term is normalised within its group, z_ik = (r_ik − mean_gk)/(std_gk + ε), the
    weighted sum Σ_k w_k z_ik is then standardised over the batch (TRL's ``normalize_then_sum``: per
    sequence, Bessel std, ε added to the std; verl whitens over tokens instead). A singleton group's
    z is 0."""
    if batch.rewards is None or batch.reward_weights is None:
        raise ValueError("advantage gdpo needs batch.rewards (N, R) and batch.reward_weights")
    z = torch.stack([normalize_rewards(batch.rewards[:, j], batch.group_ids, "group", eps)
                     for j in range(batch.rewards.shape[1])], 1)
    total = z @ batch.reward_weights.float().to(z.device)
    if not batch_normalize:
        return total
    if total.numel() < 2:
        return torch.zeros_like(total)
    return (total - total.mean()) / (total.std() + eps)


# ---- critic-based ----------------------------------------------------------------------------------

def gae(batch: RolloutBatch, gamma: float = 1.0, lam: float = 0.95, whiten: bool = True,
        eps: float = 1e-8) -> torch.Tensor:
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


def raw_reward(batch: RolloutBatch, baseline: str = "none") -> torch.Tensor:
    """The reward itself as advantage (plain REINFORCE; Williams, 1992), optionally minus a baseline:
    ``none``, ``batch`` (mean reward of the batch) or ``group`` (mean reward of the row's group)."""
    r = batch.reward.float()
    if baseline == "none":
        return r.clone()
    if baseline == "batch":
        return r - r.mean() if r.numel() else r.clone()
    if baseline == "group":
        mean, _, _ = group_stats(r, batch.group_ids)
        return r - mean
    raise ValueError(f"advantage raw_reward baseline={baseline!r} is not one of ['none', 'batch', 'group']")
