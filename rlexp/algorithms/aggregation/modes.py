"""The aggregation modes (verl's names): ``mode(per_token, mask, norm) -> scalar``, each the
micro-batch's share of the whole-batch loss, from the whole-batch counts in ``norm``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlexp.core.registry import AGGREGATIONS

if TYPE_CHECKING:
    from rlexp.algorithms.aggregation import Normaliser


@AGGREGATIONS.register(name="token-mean")
def token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """Σ l·m / tokens of the whole batch (DAPO, 2025; TRL's ``dapo``)."""
    return (per_token * mask).sum() / max(norm.total_tokens, 1.0)


@AGGREGATIONS.register(name="token-sum")
def token_sum(per_token: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """Σ l·m over the whole batch, no normaliser (verl's ``token-sum``, PR #7197): the step scales with the
    batch's token count, so the learning rate has to absorb it."""
    return (per_token * mask).sum()


@AGGREGATIONS.register(name="seq-mean-token-mean")
def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """Mean over rows of each row's token mean (GRPO, 2024; TRL's ``grpo``); the row's token count guarded by
    ``norm.token_count_guard``."""
    return ((per_token * mask).sum(-1) / norm.row_tokens(mask)).sum() / max(norm.total_rows, 1.0)


@AGGREGATIONS.register(name="seq-mean-token-sum")
def seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """Mean over rows of each row's token sum."""
    return (per_token * mask).sum(-1).sum() / max(norm.total_rows, 1.0)


@AGGREGATIONS.register(name="seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """Σ l·m / (rows · norm_length), a constant normaliser (Dr. GRPO, 2025)."""
    return (per_token * mask).sum(-1).sum() / (max(norm.total_rows, 1.0) * norm.norm_length)
