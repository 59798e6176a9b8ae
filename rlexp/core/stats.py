"""Group and token statistics shared by advantages, group stages and metrics (float32, Bessel std).

Batch-wide statistics (``masked_whiten``, a batch std or mean) sum through ``batch_sums``: this process's rows, or,
inside ``batch_spread_over`` (the trainer's distributed step, where each process holds a share of the step's rows),
every process's, so an estimator computes what it would on one process with the whole batch."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_SPREAD: ContextVar[Callable[[list[torch.Tensor]], list[torch.Tensor]] | None] = ContextVar("spread", default=None)


@contextmanager
def batch_spread_over(sum_over_processes: Callable[[list[torch.Tensor]], list[torch.Tensor]]):
    """Within the block the batch is this process's share of a larger one: ``batch_sums`` adds every process's sums
    (``sum_over_processes``: scalar tensors in, their sums over the processes out; a collective, so every process
    computes the same statistics in the same order)."""
    token = _SPREAD.set(sum_over_processes)
    try:
        yield
    finally:
        _SPREAD.reset(token)


def batch_is_spread() -> bool:
    return _SPREAD.get() is not None


def batch_sums(*values: torch.Tensor) -> list[torch.Tensor]:
    """Sums (scalar tensors) over the whole batch: as given, or summed over the processes inside
    ``batch_spread_over``."""
    spread = _SPREAD.get()
    return list(values) if spread is None else spread(list(values))


def batch_std(values: torch.Tensor) -> torch.Tensor:
    """The unbiased std of ``values`` over the whole batch (0 for fewer than two); float64 sums, float32 out."""
    values = values.double()
    n, total = batch_sums(values.new_tensor(float(values.numel())), values.sum())
    (sq,) = batch_sums(((values - total / n.clamp(min=1)) ** 2).sum())
    return torch.where(n > 1, torch.sqrt(sq / (n - 1).clamp(min=1)), torch.zeros_like(sq)).float()  # no host sync


def batch_mean(values: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over the whole batch (0 for none); float64 sums, float32 out."""
    values = values.double()
    n, total = batch_sums(values.new_tensor(float(values.numel())), values.sum())
    return (total / n.clamp(min=1)).float()


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


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) · rsqrt(var + eps) over the valid tokens of the whole batch (``batch_sums``), var with Bessel's
    correction over the token count (verl's ``masked_whiten``). Fewer than two valid tokens: the variance is taken
    as 0."""
    values, m = values.double(), mask.double()  # float64 sums: the same statistics whatever the split
    count, total = batch_sums(m.sum(), (values * m).sum())
    mean = total / count.clamp(min=1)
    (sq,) = batch_sums((((values - mean) ** 2) * m).sum())
    var = sq / (count - 1).clamp(min=1)
    if count < 2:
        var = torch.zeros_like(var)
    return ((values - mean) * torch.rsqrt(var + eps)).float()


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    _, inv = torch.unique(group_ids, return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def group_sum(values: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    return torch.zeros(k, device=values.device, dtype=values.dtype).index_add_(0, inv, values)
