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


BRPO_BASELINES = ("brpo", "group", "previous", "none")


def brpo_segment_advantages(
    scores: torch.Tensor, probs: torch.Tensor, group_ids: torch.Tensor, baseline: str = "brpo", discount: float = 2.0
) -> torch.Tensor:
    """(N, J) BRPO advantages of the thinking segments ("Optimizing Anytime Reasoning via Budget Relative Policy
    Optimization", Qi et al., 2025; arXiv 2505.13438; the released ``compute_cot_advantage``). With r_{i,k} the score
    of row i's summary at budget k and p the budget prior, for segment j (0-based) of J:

        R_{i,j} = Σ_{k≥j} p_k·r_{i,k}                                  (the return from budget j on)
        V2_{i,j} = mean of R_{·,j} over row i's group (0 for a one-row group)   (GRPO's group baseline)
        V1_{i,j} = (Σ_{k<j} w_k·r_{i,k} / Σ_{k<j} w_k)·Σ_{k≥j} p_k,  w_k = 2^k   (0 at j = 0; the row's progress)
        A_{i,j} = R_{i,j} − (j·V1_{i,j} + (J − j)·V2_{i,j}) / J

    ``baseline``: ``brpo`` (that mix), ``group`` (V2 only: GRPO's baseline), ``previous`` (V1 only), ``none``."""
    if baseline not in BRPO_BASELINES:
        raise ValueError(f"algorithm.advantage.baseline={baseline!r} is not one of {list(BRPO_BASELINES)}")
    r, p = scores.float(), probs.float().to(scores.device)
    N, J = r.shape
    weighted = r * p[None]
    ret = weighted.flip(-1).cumsum(-1).flip(-1)  # R_{i,j}
    tail = p.flip(0).cumsum(0).flip(0)  # Σ_{k≥j} p_k
    _, inv = torch.unique(group_ids.to(r.device), return_inverse=True)
    k = int(inv.max()) + 1 if N else 0
    sums = torch.zeros(k, J, device=r.device).index_add_(0, inv, ret)
    counts = torch.zeros(k, device=r.device).index_add_(0, inv, torch.ones(N, device=r.device))
    # a one-row group has no group baseline: V2 = 0 (the released code's G = 1 case)
    v2 = torch.where(counts[:, None] > 1, sums / counts[:, None], torch.zeros_like(sums))[inv]
    w = discount ** torch.arange(J, device=r.device, dtype=r.dtype)
    num = torch.cat([torch.zeros(N, 1, device=r.device), (r * w[None]).cumsum(-1)[:, :-1]], 1)
    den = torch.cat([torch.zeros(1, device=r.device), w.cumsum(0)[:-1]])
    prev = torch.where(den[None] > 0, num / den.clamp(min=1e-12)[None], torch.zeros_like(num))
    v1 = prev * tail[None]
    j = torch.arange(J, device=r.device, dtype=r.dtype)[None]
    base = {
        "brpo": (j * v1 + (J - j) * v2) / J,
        "group": v2,
        "previous": v1,
        "none": torch.zeros_like(v1),
    }[baseline]
    return ret - base


@ADVANTAGES.register
def brpo(
    batch: RolloutBatch,
    baseline: str = "brpo",
    discount: float = 2.0,
    summary: bool = True,
) -> torch.Tensor:
    """(N, T) AnytimeReasoner's token advantages: thinking tokens of segment j — positions [c_{j−1}, c_j) between
    the budget cuts (``rlexp.algorithms.group_stages.anytime.AnytimeBudgets``: ``batch.extras["budget_cuts"]``) —
    get the BRPO advantage A_{i,j} (``brpo_segment_advantages``); thinking tokens past the last cut get 0; with
    ``summary`` the row's own answer (the tokens after its closed thinking, the summary at every budget b_j ≥ e)
    gets the decoupled summary advantage mean_{j: b_j ≥ e}(r_{i,j} − mean_group r_{·,j}) (the released code's
    summary baseline, the same budget's scores over the group), else 0. No std normalisation (released code).
    The summary rows the stage added (``batch.extras["anytime_summary"]``: summaries sampled after a cut) get their
    score minus their baseline on every token and stay out of the thinking rows' statistics."""
    from rlexp.algorithms.group_stages.anytime import SUMMARY_BASELINE, SUMMARY_ROW, SUMMARY_SCORE

    is_summary = batch.extras.get(SUMMARY_ROW)
    if is_summary is None or not bool(is_summary.any()):
        return _brpo_thinking(batch, baseline, discount, summary)
    is_summary = is_summary.bool().to(batch.completion_ids.device)
    own = (~is_summary).nonzero().squeeze(-1)
    sub = batch.select(own)
    adv = torch.zeros(batch.completion_ids.shape, device=batch.completion_ids.device)
    adv_own = _brpo_thinking(sub, baseline, discount, summary)
    adv[own, : adv_own.shape[1]] = adv_own
    rows = is_summary.nonzero().squeeze(-1)
    value = batch.extras[SUMMARY_SCORE].float().to(adv.device) - batch.extras[SUMMARY_BASELINE].float().to(adv.device)
    adv[rows] = value[rows, None] * batch.completion_mask[rows].to(adv.dtype)
    batch.stats.update(sub.stats)
    batch.stats["brpo/summary_rows_adv_abs_mean"] = float(value[rows].abs().mean())
    return adv


def _brpo_thinking(batch: RolloutBatch, baseline: str, discount: float, summary: bool) -> torch.Tensor:
    """``brpo`` on the thinking rows (no stage-added summary rows)."""
    from rlexp.algorithms.group_stages.anytime import BUDGET_CUTS, BUDGET_PROBS, BUDGET_SCORES, THINK_CLOSED, THINK_END

    missing = [k for k in (BUDGET_SCORES, BUDGET_CUTS, BUDGET_PROBS, THINK_END) if k not in batch.extras]
    if missing:
        raise ValueError(
            f"algorithm.advantage=brpo needs batch.extras {missing}: add the group stage "
            "rlexp.algorithms.group_stages.anytime.AnytimeBudgets (algorithm=anytime_reasoner)"
        )
    device = batch.completion_ids.device
    scores = batch.extras[BUDGET_SCORES].float().to(device)
    cuts = batch.extras[BUDGET_CUTS].long().to(device)
    probs = batch.extras[BUDGET_PROBS][0].float().to(device)
    ends = batch.extras[THINK_END].long().to(device)
    closed = batch.extras.get(THINK_CLOSED, torch.zeros_like(ends, dtype=torch.bool)).bool().to(device)
    gids = batch.group_ids.to(device)
    seg = brpo_segment_advantages(scores, probs, gids, baseline, discount)  # (N, J)
    N, T = batch.completion_ids.shape
    J = scores.shape[1]
    pos = torch.arange(T, device=device)[None]
    adv = torch.zeros(N, T, device=device)
    starts = torch.cat([torch.zeros(N, 1, dtype=torch.long, device=device), cuts[:, :-1]], 1)
    for j in range(J):
        inside = (pos >= starts[:, j : j + 1]) & (pos < cuts[:, j : j + 1])
        adv = torch.where(inside, seg[:, j : j + 1], adv)
    summary_adv = torch.zeros(N, device=device)
    if summary:
        _, inv = torch.unique(gids, return_inverse=True)
        k = int(inv.max()) + 1 if N else 0
        sums = torch.zeros(k, J, device=device).index_add_(0, inv, scores)
        counts = torch.zeros(k, device=device).index_add_(0, inv, torch.ones(N, device=device))
        rel = scores - (sums / counts[:, None])[inv]
        own = (cuts == ends[:, None]).float()  # the budgets at or past the thinking's end
        summary_adv = (rel * own).sum(-1) / own.sum(-1).clamp(min=1.0)
        summary_adv = torch.where(closed, summary_adv, torch.zeros_like(summary_adv))
        after = pos >= ends[:, None]
        adv = torch.where(after & closed[:, None], summary_adv[:, None], adv)
    adv = adv * batch.completion_mask.to(adv.dtype)
    thinking = (pos < cuts[:, -1:]) & batch.completion_mask.bool()
    batch.stats["brpo/thinking_adv_abs_mean"] = float(adv[thinking].abs().mean()) if bool(thinking.any()) else 0.0
    batch.stats["brpo/segment_adv_std"] = float(seg.std()) if seg.numel() > 1 else 0.0
    batch.stats["brpo/summary_adv_abs_mean"] = float(summary_adv[closed].abs().mean()) if bool(closed.any()) else 0.0
    return adv
