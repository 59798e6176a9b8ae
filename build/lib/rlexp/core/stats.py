"""Group and token statistics shared by advantages, group stages and metrics (float32, Bessel std)."""

from __future__ import annotations

import torch


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
    """(x − mean) · rsqrt(var + eps) over the valid tokens, var with Bessel's correction over the token
    count (verl's ``masked_whiten``). Fewer than two valid tokens: the variance is taken as 0."""
    values, m = values.float(), mask.float()
    count = m.sum()
    mean = (values * m).sum() / count.clamp(min=1)
    var = (((values - mean) ** 2) * m).sum() / (count - 1).clamp(min=1)
    if count < 2:
        var = torch.zeros_like(var)
    return (values - mean) * torch.rsqrt(var + eps)


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    _, inv = torch.unique(group_ids, return_inverse=True)
    return inv, (int(inv.max()) + 1 if inv.numel() else 0)


def group_sum(values: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    return torch.zeros(k, device=values.device, dtype=values.dtype).index_add_(0, inv, values)
