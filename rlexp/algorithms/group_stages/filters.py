"""Filters that drop or refill groups and mask rows (DAPO: dynamic sampling, overlong filtering)."""

from __future__ import annotations

import logging
import math

import torch

from rlexp.algorithms.group_stages.base import metric_values, stage_setting
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import LOSS_MASK
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_stats

log = logging.getLogger(__name__)


def varied_groups(batch: RolloutBatch, metric: str | None = None, tol: float = 1e-8) -> torch.Tensor:
    """Row indices of the groups (of two or more rows) whose ``metric`` has a std above ``tol``."""
    values = metric_values(batch, metric)
    if len(batch) == 0:
        return torch.zeros(0, dtype=torch.long)
    _, std, count = group_stats(values, batch.group_ids)
    keep = (std > tol) & (count > 1)
    return keep.nonzero().squeeze(-1).cpu()


def _first_groups(batch: RolloutBatch, n_groups: int) -> RolloutBatch:
    seen: list[int] = []
    rows = []
    for i, g in enumerate(batch.group_ids.tolist()):
        if g not in seen:
            if len(seen) == n_groups:
                continue
            seen.append(g)
        rows.append(i)
    return batch.select(rows)


@GROUP_STAGES.register
def dynamic_sampling(
    batch: RolloutBatch,
    ctx,
    max_rounds: int = 3,
    metric: str | None = None,
    target_groups: int | None = None,
    oversample: float = 1.0,
    tol: float = 1e-8,
) -> RolloutBatch:
    """DAPO dynamic sampling: keep only groups whose ``metric`` (a reward term name; ``None`` = the
    total reward) varies, and refill by sampling fresh prompts with ``ctx.sample`` until
    ``target_groups`` (default ``trainer.prompts_per_step``) groups are kept or ``max_rounds`` refill
    rounds are spent; surplus groups are dropped (kept in arrival order). Each round asks for
    ⌈(missing groups)·``oversample``⌉ prompts. If the rounds run out short, the step trains on the
    groups it has (DAPO's code would raise); if no group varies at all, the original batch is kept
    (its advantages are 0 — our choice, so the step still runs).
    Stats: ``dynamic_sampling/{rounds,kept_groups,dropped_groups,sampled_groups}``."""
    if max_rounds < 0:
        raise ValueError(f"dynamic_sampling.max_rounds={max_rounds} must be >= 0")
    if oversample < 1.0:
        raise ValueError(f"dynamic_sampling.oversample={oversample} must be >= 1")
    target = int(target_groups or stage_setting(ctx, "prompts_per_step", batch.num_groups))
    if target < 1:
        raise ValueError(f"dynamic_sampling.target_groups={target} must be >= 1")
    sampled, rounds, refill_reward_s = batch.num_groups, 0, 0.0
    kept = batch.select(varied_groups(batch, metric, tol))
    parts = [kept] if len(kept) else []
    n_kept = kept.num_groups
    while n_kept < target and rounds < max_rounds:
        rounds += 1
        fresh = ctx.sample(math.ceil((target - n_kept) * oversample))
        refill_reward_s += fresh.stats.pop("time/reward_s", 0.0)
        sampled += fresh.num_groups
        good = fresh.select(varied_groups(fresh, metric, tol))
        if len(good):
            parts.append(good)
            n_kept += good.num_groups
    if parts:
        out = _first_groups(RolloutBatch.concat(parts) if len(parts) > 1 else parts[0], target)
    else:
        log.warning(
            "dynamic_sampling: no group with varying %s after %d refill rounds; keeping the batch",
            metric or "reward",
            rounds,
        )
        out = batch
    out.stats = dict(batch.stats)
    if refill_reward_s:
        out.stats["time/reward_s"] = out.stats.get("time/reward_s", 0.0) + refill_reward_s
    kept_groups = out.num_groups if parts else 0
    out.stats.update(
        {
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/kept_groups": float(kept_groups),
            "dynamic_sampling/sampled_groups": float(sampled),
            "dynamic_sampling/dropped_groups": float(sampled - kept_groups),
        }
    )
    return out


@GROUP_STAGES.register
def overlong_mask(batch: RolloutBatch, ctx=None) -> RolloutBatch:
    """DAPO overlong filtering: completions that hit the length limit (no EOS) get loss weight 0
    (``batch.extras["loss_mask"]``, see ``masks``). Their reward still enters the group statistics
    (TRL's ``mask_truncated_completions``). Stat: ``overlong/masked_frac``."""
    keep = (~batch.truncated.bool()).float()
    prev = batch.extras.get(LOSS_MASK)
    batch.extras[LOSS_MASK] = keep if prev is None else prev.float() * keep
    batch.stats["overlong/masked_frac"] = float(1.0 - keep.mean()) if len(batch) else 0.0
    return batch
