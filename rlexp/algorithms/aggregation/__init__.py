"""Loss aggregation modes with *global* normalisers, so the result of a step does not depend on
micro-batching: each micro-batch's value is its share of the full-batch loss, and the shares add
up to the full-batch loss exactly.

Modes (verl's names):
* ``token-mean``              Σ l·m / (tokens in the whole batch)          (DAPO, 2025; TRL dapo)
* ``token-sum``               Σ l·m, no normaliser                          (verl token-sum)
* ``seq-mean-token-mean``     mean over rows of the row's token mean        (GRPO, 2024; TRL grpo)
* ``seq-mean-token-sum``      mean over rows of the row's token sum
* ``seq-mean-token-sum-norm`` Σ l·m / (rows · norm_length)                  (Dr. GRPO, 2025)

Conventions: an all-masked row contributes 0; per-row means divide by the rows that have at least
one valid token (verl; TRL divides by all rows: ``count_empty_rows=True``); token counts are
guarded with clamp(min=1) (TRL) so an all-masked batch gives exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlexp.algorithms.aggregation import modes as modes  # the registered modes
from rlexp.core.registry import AGGREGATIONS


@dataclass(frozen=True)
class Normaliser:
    """Whole-batch counts, computed once per optimiser step from the full rollout batch."""

    total_tokens: float
    total_rows: float
    norm_length: float = 1.0

    @staticmethod
    def from_mask(mask: torch.Tensor, count_empty_rows: bool = False, norm_length: float | None = None) -> Normaliser:
        rows = mask.shape[0] if count_empty_rows else int((mask.sum(-1) > 0).sum())
        return Normaliser(float(mask.sum()), float(rows), float(norm_length or mask.shape[1]))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normaliser) -> torch.Tensor:
    """The micro-batch's share of the whole-batch loss under the aggregation ``mode`` (a registered
    name: ``rlexp list parts``)."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation mode {mode!r} is not one of {MODES}")
    return AGGREGATIONS(mode)(per_token, mask.to(per_token.dtype), norm)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


MODES = AGGREGATIONS.names()
