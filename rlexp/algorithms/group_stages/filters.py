"""Filters that drop or refill groups and mask rows (DAPO: dynamic sampling, overlong filtering; GPG's
resampling is dynamic sampling with a lower bar and the degenerate groups kept)."""

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


REFILLS = ("missing", "batch")


@GROUP_STAGES.register
def dynamic_sampling(
    batch: RolloutBatch,
    ctx,
    max_rounds: int = 3,
    metric: str | None = None,
    target_groups: int | None = None,
    oversample: float = 1.0,
    tol: float = 1e-8,
    min_varied_frac: float = 1.0,
    keep_degenerate: bool = False,
    refill: str = "missing",
) -> RolloutBatch:
    """Dynamic sampling: keep the groups whose ``metric`` (a reward term name; ``None`` = the total reward)
    varies, and refill by sampling fresh prompts with ``ctx.sample`` until the kept groups reach
    ``min_varied_frac`` × ``target_groups`` (default ``trainer.prompts_per_step``) or ``max_rounds`` refill
    rounds are spent. Each round asks for ⌈(target − kept)·``oversample``⌉ prompts (``refill=missing``) or a
    whole batch of ``target`` prompts (``refill=batch``: verl's DAPO recipe, GPG's trainer). The step then
    trains on ``target`` groups in arrival order: the varied ones (surplus dropped) and, with
    ``keep_degenerate``, the zero-variance groups of the last sampled batch after them, up to ``target``.

    * DAPO (``min_varied_frac=1``, ``keep_degenerate=false``): only varied groups, as many as the batch holds.
      If the rounds run out short, the step trains on the groups it has (DAPO's code would raise).
    * GPG (``min_varied_frac=0.5``, ``keep_degenerate=true``, ``refill=batch``; AMAP-ML/GPG
      ``open-r1/src/open_r1/gpg_trainer.py``, ``_generate_and_score_completions``): resample whole batches until
      at least half the groups seen are informative, then fill the batch with the last batch's degenerate
      groups; the share of varied groups, 1/α of GPG's rescaling, is then ≥ 0.5.

    If no group varies at all, the original batch is kept (its advantages are 0 — our choice, so the step
    still runs). Stats: ``dynamic_sampling/{rounds,kept_groups,dropped_groups,sampled_groups,varied_frac}``
    (``varied_frac``: share of the step's groups whose metric varies)."""
    if max_rounds < 0:
        raise ValueError(f"dynamic_sampling.max_rounds={max_rounds} must be >= 0")
    if oversample < 1.0:
        raise ValueError(f"dynamic_sampling.oversample={oversample} must be >= 1")
    if not 0.0 < min_varied_frac <= 1.0:
        raise ValueError(f"dynamic_sampling.min_varied_frac={min_varied_frac} must be in (0, 1]")
    if refill not in REFILLS:
        raise ValueError(f"dynamic_sampling.refill={refill!r} is not one of {list(REFILLS)}")
    target = int(target_groups or stage_setting(ctx, "prompts_per_step", batch.num_groups))
    if target < 1:
        raise ValueError(f"dynamic_sampling.target_groups={target} must be >= 1")
    needed = min_varied_frac * target - 1e-9
    sampled, rounds, refill_reward_s = batch.num_groups, 0, 0.0
    varied = varied_groups(batch, metric, tol)
    kept = batch.select(varied)
    last = batch  # the last sampled batch: its degenerate groups fill the step with keep_degenerate
    parts = [kept] if len(kept) else []
    n_kept = kept.num_groups
    while n_kept < needed and rounds < max_rounds:
        rounds += 1
        n = target if refill == "batch" else math.ceil((target - n_kept) * oversample)
        fresh = ctx.sample(n)
        refill_reward_s += fresh.stats.pop("time/reward_s", 0.0)
        sampled += fresh.num_groups
        good = fresh.select(varied_groups(fresh, metric, tol))
        last = fresh
        if len(good):
            parts.append(good)
            n_kept += good.num_groups
    n_varied = min(n_kept, target)
    if parts:
        if keep_degenerate and n_kept < target:
            keep = torch.ones(len(last), dtype=torch.bool)
            keep[varied_groups(last, metric, tol)] = False
            if keep.any():
                parts.append(last.select(keep.nonzero().squeeze(-1)))
        out = _first_groups(RolloutBatch.concat(parts) if len(parts) > 1 else parts[0], target)
    else:
        log.warning(
            "dynamic_sampling: no group with varying %s after %d refill rounds; keeping the batch",
            metric or "reward",
            rounds,
        )
        out, n_varied = batch, 0
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
            "dynamic_sampling/varied_frac": n_varied / max(out.num_groups, 1),
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
