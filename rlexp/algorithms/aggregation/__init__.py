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
one valid token (verl; TRL divides by all rows: ``count_empty_rows=True``); a row's token count in
``seq-mean-token-mean`` is guarded with clamp(min=1) (TRL; ``token_count_guard="clamp"``) or + 1e-8 (verl;
``"eps"``), which differ only for a row whose (fractional) loss-mask weights sum to less than 1; the whole-batch
token count is guarded with max(·, 1) so an all-masked batch gives exactly 0.
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
    token_count_guard: str = "clamp"  # a row's token count: clamp(min=1) (TRL) | eps: + 1e-8 (verl)

    def __post_init__(self):
        if self.token_count_guard not in TOKEN_COUNT_GUARDS:
            raise ValueError(
                f"algorithm.token_count_guard={self.token_count_guard!r} is not one of {TOKEN_COUNT_GUARDS}"
            )

    def row_tokens(self, mask: torch.Tensor) -> torch.Tensor:
        """Each row's token count, guarded against 0."""
        count = mask.sum(-1)
        return count.clamp(min=1) if self.token_count_guard == "clamp" else count + 1e-8

    @staticmethod
    def from_mask(
        mask: torch.Tensor,
        count_empty_rows: bool = False,
        norm_length: float | None = None,
        token_count_guard: str = "clamp",
    ) -> Normaliser:
        rows = mask.shape[0] if count_empty_rows else int((mask.sum(-1) > 0).sum())
        return Normaliser(float(mask.sum()), float(rows), float(norm_length or mask.shape[1]), token_count_guard)


TOKEN_COUNT_GUARDS = ("clamp", "eps")


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
