"""HBPO's budget-aware reward and advantage — "Hierarchical Budget Policy Optimization for Adaptive Reasoning" (Lyu et
al., 2025; arXiv 2507.15844; released code ZJU-REAL/HBPO, its paper source's equations and Algorithm 1).

Each group's completions come in budget subgroups (``rlexp.algorithms.prompt_conditions.budgets.BudgetPrefill``: the
budget b of each row in ``batch.extras["condition"]``). With n the completion's length in tokens and L_max the
generation limit (α = 1/L_max by default):

    f1(n, b) = β·cos(π·n / (2·L_max)) − α·|n − b|        f2(b) = β·cos(π·b / (2·L_max))
    R = f2(b) if correct and n ≤ b;  f1(n, b) if correct and n > b;  0 if wrong

A correct completion inside its budget earns the budget's full reward (smaller budgets earn more), one past it loses
with its length and its overshoot. The advantage adds the subgroup's standing to the completion's place in the group:

    A_intra = mean_{subgroup}(R) − f2(b)        A_inter = (R − mean_group(R)) / (std_group(R) + ε)
    A = A_inter + A_intra
"""

from __future__ import annotations

import math

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import CONDITION
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_stats


def budget_reward(
    correct: torch.Tensor, lengths: torch.Tensor, budgets: torch.Tensor, l_max: float, beta: float, alpha: float
) -> torch.Tensor:
    """(N,) HBPO's piecewise reward (see the module doc)."""
    n, b = lengths.float(), budgets.float()
    f1 = beta * torch.cos(math.pi * n / (2 * l_max)) - alpha * (n - b).abs()
    f2 = beta * torch.cos(math.pi * b / (2 * l_max))
    return torch.where(correct, torch.where(n <= b, f2, f1), torch.zeros_like(n))


@ADVANTAGES.register
def hbpo(
    batch: RolloutBatch,
    l_max: float,
    beta: float = 4.0,
    alpha: float | None = None,
    metric: str = "accuracy",
    correct_min: float = 1.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(N,) HBPO advantage: inter-group normalised budget reward plus the budget subgroup's intra term."""
    if l_max <= 0:
        raise ValueError(f"algorithm.advantage.l_max={l_max} must be > 0")
    budgets = batch.extras.get(CONDITION)
    if budgets is None:
        raise ValueError("algorithm.advantage=hbpo needs budget subgroups: algorithm.prompt_condition=BudgetPrefill")
    if metric not in batch.reward_names:
        raise KeyError(f"algorithm.advantage.metric={metric!r} is not a reward term (terms: {batch.reward_names})")
    alpha = 1.0 / l_max if alpha is None else alpha
    budgets = budgets.to(batch.reward.device).float()
    correct = batch.term(metric).float() >= correct_min
    reward = budget_reward(correct, batch.lengths.to(budgets.device), budgets, l_max, beta, alpha)
    mean, std, _ = group_stats(reward, batch.group_ids)
    inter = (reward - mean) / (std + eps)
    # subgroups: the same group and the same budget
    key = batch.group_ids.to(budgets.device).double() * 1e6 + budgets.double()
    sub_mean, _, _ = group_stats(reward, key)
    intra = sub_mean - beta * torch.cos(math.pi * budgets / (2 * l_max))
    batch.stats["hbpo/reward_mean"] = float(reward.mean())
    batch.stats["hbpo/intra_mean"] = float(intra.mean())
    batch.stats["hbpo/within_budget_frac"] = float((batch.lengths.to(budgets.device).float() <= budgets).float().mean())
    return inter + intra
