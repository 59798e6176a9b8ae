"""SSRL's information mask ("SSRL: Self-Search Reinforcement Learning", Fan, Zhang, Zhou et al., 2025, arXiv
2508.10874; released code TsinghuaC3I/SSRL, ``verl/trainer/ppo/ray_trainer.py``: ``create_information_loss_mask``,
on in its run script ``examples/ssrl/example.sh``: ``enable_information_loss_mask=True``).

In self-search the policy is its own search engine: one completion reasons in ``<think>``, writes a query in
``<search>…</search>``, then the "retrieved" text itself in ``<information>…</information>``, and answers in
``<answer>``. The information is sampled by the policy, not returned by a tool, so it could be trained on like any
other token; SSRL masks it out of the loss, as Search-R1 masks a real search engine's results, so the policy learns
to search and to use what it found rather than to write plausible documents. This stage sets
``batch.extras["token_loss_mask"]`` (``rlexp.core.masks``) to 0 on every token that overlaps an
``<information>…</information>`` span, the tags included, of each completion; the tokens stay in the context, the
reward and the length. Positions come from the completion's own tokens (the character lengths of decoded
prefixes), never from re-tokenising its text (the release re-encodes the decoded text). ``mask: false`` keeps the
information in the loss (the ablation) and only measures it.

The release finds the spans with a pattern without ``re.DOTALL``, so an information block spanning lines stays in
its loss; here every block is masked, and an unclosed ``<information>`` (a completion cut by the token limit) is
masked to the end.

Metrics: ``ssrl/masked_frac`` (the share of completion tokens masked), ``ssrl/searches`` (``<search>`` blocks per
completion), ``ssrl/information_rows_frac`` (completions with an information block)."""

from __future__ import annotations

import re

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_LOSS_MASK
from rlexp.core.registry import GROUP_STAGES

_BLOCK = re.compile(r"<information>.*?(</information>|$)", re.S)


def information_spans(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the ``<information>…</information>`` blocks of ``text`` (tags included; an
    unclosed block runs to the end)."""
    return [(m.start(), m.end()) for m in _BLOCK.finditer(text)]


def masked_positions(tokenizer, ids: list[int]) -> tuple[list[int], str]:
    """(token indices overlapping an information block, the decoded text) of a completion's token ids. A block's
    first and last tokens are found by bisection on the character length of decoded prefixes (exact where a
    character's bytes are split across tokens; a few decodes per block)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    spans = information_spans(text)
    if not spans:
        return [], text
    cache: dict[int, int] = {}

    def length(k: int) -> int:  # characters the first k tokens decode to
        if k not in cache:
            cache[k] = len(tokenizer.decode(ids[:k], skip_special_tokens=True))
        return cache[k]

    def holding(c: int) -> int:  # the token holding character c: the smallest k with length(k + 1) > c
        lo, hi = 0, len(ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if length(mid + 1) > c:
                hi = mid
            else:
                lo = mid + 1
        return lo

    out: set[int] = set()
    for a, b in spans:
        out.update(range(holding(a), holding(b - 1) + 1))
    return sorted(out), text


@GROUP_STAGES.register
class InformationMask:
    """Group stage: SSRL's information mask — the tokens of each completion's ``<information>`` blocks out of the
    loss (``mask: true``, the release's run) or only counted (``mask: false``); see module doc."""

    def __init__(self, mask: bool = True):
        self.mask = bool(mask)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        ids = batch.completion_ids.cpu()
        lengths = batch.completion_mask.sum(-1).cpu().tolist()
        weights = torch.ones(batch.completion_mask.shape, dtype=torch.float32)
        masked, rows, searches = 0, 0, 0
        for i in range(len(batch)):
            row = ids[i, : int(lengths[i])].tolist()
            positions, text = masked_positions(ctx.tokenizer, row)
            searches += text.count("<search>")
            if positions:
                rows += 1
                masked += len(positions)
                weights[i, positions] = 0.0
        if self.mask:
            weights = weights.to(batch.completion_mask.device)
            prev = batch.extras.get(TOKEN_LOSS_MASK)
            batch.extras[TOKEN_LOSS_MASK] = weights if prev is None else prev.float() * weights
        n = max(1, len(batch))
        batch.stats["ssrl/masked_frac"] = masked / max(1, int(sum(lengths)))
        batch.stats["ssrl/searches"] = searches / n
        batch.stats["ssrl/information_rows_frac"] = rows / n
        return batch
