"""Advantages for a best-of-group objective: only the group's best completion learns (pass@k training,
verl's ``grpo_passk``, citing arXiv 2503.19595)."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES


@ADVANTAGES.register
def passk(batch: RolloutBatch, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Per group, the best completion gets r_max − r_second (divided by the group's unbiased reward std + ε
    with ``scale``, verl's ``norm_adv_by_std_in_grpo``); every other completion gets 0. A tie for the best
    goes to the first in batch order (and gives advantage 0). Groups of one are refused, as in verl."""
    r = batch.reward.float()
    adv = torch.zeros_like(r)
    groups, inverse = torch.unique(batch.group_ids, return_inverse=True)
    for g in range(len(groups)):
        rows = (inverse == g).nonzero().squeeze(-1)
        if rows.numel() < 2:
            raise ValueError(f"advantage passk needs at least 2 completions per group; group {int(groups[g])} has 1")
        values = r[rows]
        order = torch.argsort(values, descending=True, stable=True)
        best, second = values[order[0]], values[order[1]]
        a = best - second
        if scale:
            a = a / (values.std() + eps)
        adv[rows[order[0]]] = a
    return adv
