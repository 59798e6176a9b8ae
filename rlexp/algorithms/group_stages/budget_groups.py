"""Knapsack RL's groups ("Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation", 2025, arXiv
2509.25849): the knapsack sampler (``sampler=knapsack``, rlexp/samplers/knapsack.py) gives a prompt k units of G
rollouts by repeating its record k times, adjacent, and the trainer numbers one group per record; this stage makes
the k·G rows of each prompt one group again, so GRPO's advantage is normalised over all of the prompt's rollouts (the
paper rolls a prompt out N_i times in one group). Put it first among the group stages, before any stage that reads
groups."""

from __future__ import annotations

import torch

from rlexp.algorithms.group_stages.base import metric_values
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_stats
from rlexp.samplers.feedback import group_rows, record_key
from rlexp.samplers.knapsack import UNITS_KEY


def _zero_gradient_share(values: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-8) -> float:
    """The share of groups whose values do not vary (a one-row group counts as not varying)."""
    _, std, count = group_stats(values.float(), group_ids)
    firsts = torch.ones_like(group_ids, dtype=torch.bool)
    firsts[1:] = group_ids[1:] != group_ids[:-1]
    flat = (std <= tol) | (count < 2)
    return float(flat[firsts].float().mean()) if len(group_ids) else 0.0


@GROUP_STAGES.register
def merge_allocated_groups(
    batch: RolloutBatch, ctx, metric: str | None = None, require_allocation: bool = True
) -> RolloutBatch:
    """Merge each run of adjacent groups of the same record (``rlexp.samplers.feedback.record_key``) into one group;
    group ids are renumbered 0, 1, … in order. ``require_allocation``: refuse a batch whose records carry no knapsack
    allocation (a run without ``sampler=knapsack``). Stats, with ``metric`` a reward term (null: the total reward):
    ``knapsack/zero_gradient_groups`` (share of the merged groups whose metric does not vary),
    ``knapsack/zero_gradient_units`` (the same share over the groups of G before merging),
    ``knapsack/merged_groups`` (groups of G folded into another) and ``knapsack/group_rows_max``."""
    if len(batch) == 0:
        return batch
    if require_allocation and not any(UNITS_KEY in r for r in batch.records):
        raise ValueError(
            "algorithm.group_stages: merge_allocated_groups merges the units the knapsack sampler allocates, but this "
            "batch's records carry none: run it with sampler=knapsack (rlexp train algorithm=knapsack_grpo "
            "sampler=knapsack, or +experiment=knapsack_rl), or set its require_allocation=false"
        )
    values = metric_values(batch, metric)
    before = _zero_gradient_share(values, batch.group_ids)
    groups = group_rows(batch.group_ids)
    new_ids = torch.empty_like(batch.group_ids)
    current, last_key = -1, None
    for rows in groups:
        key = record_key(batch.records[int(rows[0])])
        if key != last_key:
            current, last_key = current + 1, key
        new_ids[rows] = current
    batch.group_ids = new_ids
    _, _, count = group_stats(values.float(), new_ids)
    batch.stats["knapsack/zero_gradient_groups"] = _zero_gradient_share(values, new_ids)
    batch.stats["knapsack/zero_gradient_units"] = before
    batch.stats["knapsack/merged_groups"] = float(len(groups) - (current + 1))
    batch.stats["knapsack/group_rows_max"] = float(count.max())
    return batch
