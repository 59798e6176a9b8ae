"""DAPO's soft overlong punishment, added as a reward column."""

from __future__ import annotations

import torch

from rlexp.algorithms.group_stages.base import stage_setting
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES


def soft_overlong_punishment(lengths: torch.Tensor, max_length: float, cache_length: float) -> torch.Tensor:
    """DAPO Eq. 13: 0 for |y| ≤ L_max − L_cache; (L_max − L_cache − |y|)/L_cache up to L_max; −1 beyond."""
    lengths = lengths.float()
    free = max_length - cache_length
    ramp = (free - lengths) / cache_length
    return torch.where(
        lengths <= free, torch.zeros_like(lengths), torch.where(lengths <= max_length, ramp, -torch.ones_like(lengths))
    )


@GROUP_STAGES.register
def overlong_penalty(
    batch: RolloutBatch,
    ctx=None,
    max_length: float | None = None,
    cache_length: float | None = None,
    cache_fraction: float = 0.2,
    weight: float = 1.0,
    name: str = "overlong",
) -> RolloutBatch:
    """DAPO soft overlong punishment as an extra reward term ``name`` (weight ``weight``), so it shows
    in ``reward/<name>/mean`` and in per-term estimators (GDPO). L_max = ``max_length`` (default
    ``trainer.max_new_tokens``), L_cache = ``cache_length`` or ``cache_fraction``·L_max (DAPO:
    L_max = 20480, L_cache = 4096, i.e. 0.2). Lengths count completion tokens including EOS."""
    L = float(max_length or stage_setting(ctx, "max_new_tokens", 0))
    if L <= 0:
        raise ValueError("overlong_penalty.max_length is not set and ctx.settings.max_new_tokens is missing")
    cache = float(cache_length) if cache_length is not None else cache_fraction * L
    if not 0 < cache <= L:
        raise ValueError(f"overlong_penalty.cache_length={cache} must be in (0, max_length={L}]")
    if name in batch.reward_names:
        raise ValueError(f"overlong_penalty.name={name!r} is already a reward term")
    pen = soft_overlong_punishment(batch.lengths, L, cache).to(batch.reward.device)
    w = torch.tensor([float(weight)], device=batch.reward.device)
    batch.rewards = torch.cat([batch.rewards, pen[:, None]], 1)
    batch.reward_failures = torch.cat([batch.reward_failures, torch.zeros_like(pen, dtype=torch.bool)[:, None]], 1)
    batch.reward_weights = torch.cat([batch.reward_weights.float(), w])
    batch.reward_names = [*batch.reward_names, name]
    batch.reward = batch.reward + weight * pen
    return batch
