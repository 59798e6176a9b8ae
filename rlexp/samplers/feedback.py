"""What a sampler learns from a step: per group (one prompt's G completions) its record, the share of completions the
accuracy term scored correct, and, once the update's advantages exist, their mean magnitude. The trainer builds it
(``GroupFeedback.from_batch``) and hands it to the sampler; a sampler never reads the trainer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def record_key(record: dict) -> str:
    """The identity of a prompt across steps: its ``id``, else its question."""
    return str(record.get("id", record.get("question")))


@dataclass
class GroupFeedback:
    """Per group of the step: ``records`` (the group's record), ``pass_rate`` (mean of the accuracy term over the
    group's completions; NaN when the run has no accuracy term) and ``all_correct``."""

    records: list[dict]
    pass_rate: list[float]
    all_correct: list[bool] = field(default_factory=list)

    @classmethod
    def from_batch(cls, batch, accuracy_term: str | None) -> GroupFeedback:
        """Per group, in the order the groups first appear; a few vector operations and two host reads, so the
        default step pays next to nothing for it."""
        ids = batch.group_ids
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[1:] = ids[1:] != ids[:-1]
        firsts = starts.nonzero().squeeze(-1).tolist()
        records = [batch.records[i] for i in firsts]
        if accuracy_term not in batch.reward_names:
            return cls(records, [math.nan] * len(records), [False] * len(records))
        which = starts.long().cumsum(0) - 1  # each row's group index
        correct = (batch.term(accuracy_term) >= 1.0).float()
        n = torch.zeros(len(firsts), device=correct.device).index_add_(0, which, torch.ones_like(correct))
        right = torch.zeros_like(n).index_add_(0, which, correct)
        rates = (right / n).tolist()
        return cls(records, rates, [r == 1.0 for r in rates])


def group_rows(group_ids: torch.Tensor) -> list[torch.Tensor]:
    """The row indices of each group, in the order the groups first appear."""
    return [(group_ids == g).nonzero().squeeze(-1) for g in torch.unique_consecutive(group_ids).tolist()]


def mean_abs_advantage(batch, rows: torch.Tensor) -> float:
    """Mean |A| over the rows (token-level advantages: their token-mean over the completion first)."""
    adv = batch.advantages[rows].float()
    if adv.dim() == 2:
        mask = batch.completion_mask[rows].float()
        adv = (adv.abs() * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return float(adv.abs().mean())
