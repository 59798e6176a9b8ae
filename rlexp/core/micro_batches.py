"""Micro-batch plans of a rollout batch: which rows go through one forward/backward, with each one's padding-free
window and shared prompts, worked out on the host."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import PromptGroups, trim_window


def micro_batches(
    n: int,
    size: int,
    lengths: torch.Tensor | None = None,
    max_tokens: int | None = None,
    prompt_lengths: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Row indices per micro-batch. Rows are sorted by completion length, longest first, so a
    micro-batch pads little; with ``group_ids`` whole groups stay together instead, ordered by their
    longest completion (their rows can share one prompt forward, at the price of padding every row to
    the group's longest). A micro-batch takes at most ``size`` rows (0: no limit) and, with
    ``max_tokens``, at most that many padded positions, rows × (longest prompt + longest completion in
    it; ``prompt_lengths``, ``lengths``): long rows train in small micro-batches, short rows in large
    ones (verl's ``use_dynamic_bsz``); a row over the budget goes alone. The whole-batch loss
    normalisers make the gradient independent of the split."""
    size = size if size > 0 else n
    order = torch.arange(n) if lengths is None else torch.argsort(lengths, descending=True, stable=True)
    if group_ids is not None and lengths is not None:
        _, inv = torch.unique(group_ids, return_inverse=True)
        group_max = torch.zeros(int(inv.max()) + 1, dtype=lengths.dtype).scatter_reduce(0, inv, lengths, "amax")[inv]
        order = order[torch.argsort(group_ids[order], stable=True)]
        order = order[torch.argsort(group_max[order], descending=True, stable=True)]
    if not max_tokens:
        return [order[i : i + size] for i in range(0, n, size)]
    if lengths is None or prompt_lengths is None:
        raise ValueError("micro_batches: max_tokens needs the rows' lengths and prompt_lengths")
    out, start, p_max, c_max = [], 0, 0, 0
    for i, row in enumerate(order.tolist()):
        p, c = max(p_max, int(prompt_lengths[row])), max(c_max, int(lengths[row]))
        rows = i - start + 1
        if rows > 1 and (rows > size or rows * (p + c) > max_tokens):
            out.append(order[start:i])
            start, p, c = i, int(prompt_lengths[row]), int(lengths[row])
        p_max, c_max = p, c
    out.append(order[start:])
    return out


class MicroBatch:
    """One micro-batch's rows, its padding-free column window and which rows share a prompt, worked
    out on the host from one copy of the batch's prompt ids and masks, so neither slicing nor the
    shared prompt forward needs a device round trip per micro-batch; ``to(device)`` then moves the
    row index and the prompt grouping in one go."""

    def __init__(
        self, idx: torch.Tensor, prompt_ids_cpu, prompt_mask_cpu, completion_mask_cpu, find_groups: bool = True
    ):
        self.idx = self.dev_idx = idx
        self.start, self.end = trim_window(prompt_mask_cpu[idx], completion_mask_cpu[idx])
        pm, n_rows = prompt_mask_cpu[idx, self.start :], len(idx)
        self.prompt_groups = None  # None: no prompt repeats, or not looked for
        self._labels = None  # per row: which of the micro-batch's distinct prompts it has
        prompt_rows = torch.arange(n_rows)  # rows whose prompt goes through the model
        if find_groups:
            _, self._labels = torch.unique(prompt_ids_cpu[idx, self.start :], dim=0, return_inverse=True)
            prompt_rows = torch.zeros(int(self._labels.max()) + 1, dtype=torch.long).scatter_(
                0, self._labels, prompt_rows
            )
        # positions the forward runs (padding included) and how many of them are real tokens
        self.positions = len(prompt_rows) * pm.shape[1] + n_rows * self.end
        self.tokens = int(pm[prompt_rows].sum() + completion_mask_cpu[idx].sum())

    def to(self, device) -> MicroBatch:
        self.dev_idx = self.idx.to(device)
        if self._labels is not None:
            self.prompt_groups = PromptGroups.from_index(self._labels, device)
        return self

    def rows(self, batch: RolloutBatch):
        """prompt ids, prompt mask, completion ids, completion mask of the rows, trimmed; and ``end``."""
        i, s, e = self.dev_idx, self.start, self.end
        return (
            batch.prompt_ids[i, s:],
            batch.prompt_mask[i, s:],
            batch.completion_ids[i, :e],
            batch.completion_mask[i, :e],
            e,
        )


def plan_micro_batches(
    batch: RolloutBatch, micro_batch: int, share_prompts: bool = True, max_tokens: int | None = None
) -> list[MicroBatch]:
    """``micro_batches`` of the batch, with each one's trimmed window (see ``trim``) and, with
    ``share_prompts``, which of its rows share a prompt. Without sharing, rows are cut by length:
    a group's completions differ in length, and keeping them together padded each to the group's
    longest — on one SmolLM2 rollout at 16 × 8 × 256 (``benchmarks/micro_batch_ab.py``) whole groups
    ran 40,768 padded positions (55 % padding; TRL's whole-batch padding: 40,960), rows by length
    21,728 (16 %). With sharing, whole groups run each prompt once per micro-batch instead of once per
    group member present, which wins when completions are short next to the prompt; so both plans are
    counted on the host and the one with fewer positions is taken (rows by length on a tie)."""
    p, pm, cm = batch.prompt_ids.cpu(), batch.prompt_mask.cpu(), batch.completion_mask.cpu()
    lengths, prompt_lengths = batch.lengths.cpu(), pm.sum(1)

    def plan(group_ids):
        return [
            MicroBatch(idx, p, pm, cm, share_prompts)
            for idx in micro_batches(len(batch), micro_batch, lengths, max_tokens, prompt_lengths, group_ids)
        ]

    best = plan(None)
    if share_prompts:
        by_group = plan(batch.group_ids.cpu())
        if sum(mb.positions for mb in by_group) < sum(mb.positions for mb in best):
            best = by_group
    return [mb.to(batch.prompt_ids.device) for mb in best]


def group_mini_batches(group_ids: torch.Tensor, k: int, seed: int) -> list[torch.Tensor]:
    """Row indices of ``k`` mini-batches for ``k`` optimiser steps on one rollout batch: whole groups (a
    group's baseline and its rows' advantages stay together), the groups in an order drawn from ``seed``,
    split as evenly as possible (the first ``n_groups % k`` mini-batches take one group more); rows keep
    their batch order inside a mini-batch. ``k`` is capped at the number of groups (after DAPO's filter a
    step may hold fewer groups than the schedule's mini-batches)."""
    groups, inverse = torch.unique(group_ids.cpu(), return_inverse=True)
    k = max(1, min(k, len(groups)))
    order = torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed))
    out = []
    for chunk in torch.tensor_split(order, k):
        member = torch.zeros(len(groups), dtype=torch.bool)
        member[chunk] = True
        out.append(member[inverse].nonzero().squeeze(-1))
    return out
