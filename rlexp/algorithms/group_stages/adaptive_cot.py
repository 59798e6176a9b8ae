"""AdaCoT's Selective Loss Masking ("AdaCoT: Pareto-Optimal Adaptive Chain-of-Thought Triggering via Reinforcement
Learning", Lou et al., 2025; arXiv 2505.11896), as a group stage.

In AdaCoT the response opens with ``<think>``; the token right after it decides whether the model reasons (a
reasoning token) or answers directly (the closing ``</think>``): the decision token. In an RL stage whose data all
favour one side (the paper's mathematical-reasoning stage, where reasoning always pays), the gradient on that one
token drives the triggering rate to 0 % or 100 % — "decision boundary collapse". SLM leaves the decision token out of
the policy loss in such stages, so the decision boundary learned before (the SFT stage in the paper) is kept while
the other tokens train as usual.

Here the decision token of a row is found on its sampled ids (never by re-tokenising the text): the first
non-blank token after the ``<think>`` tag when the completion opens with it (the tag's own last token when it
merges with the following text), else the first completion token (the decision not to open a reasoning block at
all, which our prompt allows). Its weight in ``batch.extras["token_loss_mask"]`` (``rlexp.core.masks``) becomes 0:
out of the loss and of the aggregation's token counts. ``start_step`` / ``end_step`` bound the steps on which it acts
(the paper's "some stages"; null: every step). Stats: ``adacot/masked_tokens`` (positions masked this step),
``adacot/trigger_rate`` (share of rows whose reasoning block is non-empty, ``rlexp.rewards.adaptive_cot``),
``adacot/opened_frac`` (rows that open a block) and ``adacot/slm_active``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_LOSS_MASK
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.adaptive_cot import cot_triggered


def decision_position(
    ids: list[int], decode: Callable[[list[int]], str], open_tag: str = "<think>", max_scan: int = 32
):
    """(position, opened) of a completion's CoT decision token on its ids (see the module doc); position None when
    the completion ends before it (or only white space is found within ``max_scan`` tokens)."""
    n = min(len(ids), max_scan)
    for k in range(1, n + 1):
        text = decode(ids[:k]).lstrip()
        if not text:
            continue  # leading white space: undecided
        if not text.startswith(open_tag):
            if open_tag.startswith(text):
                continue  # a prefix of the tag so far
            return 0, False  # no reasoning block: the first token decided
        if len(text) > len(open_tag):
            rest = text[len(open_tag) :]
            if rest.strip():
                return k - 1, True  # the tag's last token carries the first content: it decides
        j = k  # the tag ends at a token boundary (or with white space): the first non-blank token after it
        while j < len(ids) and j < max_scan + k and not decode(ids[j : j + 1]).strip():
            j += 1
        return (j, True) if j < len(ids) else (None, True)
    return None, False


@GROUP_STAGES.register
def selective_loss_mask(
    batch: RolloutBatch,
    ctx=None,
    open_tag: str = "<think>",
    close_tag: str = "</think>",
    start_step: int | None = None,
    end_step: int | None = None,
    max_scan: int = 32,
) -> RolloutBatch:
    """AdaCoT's SLM: the decision token of every row gets weight 0 in ``batch.extras["token_loss_mask"]`` on the steps
    in [``start_step``, ``end_step``] (module doc)."""
    if max_scan < 1:
        raise ValueError(f"selective_loss_mask.max_scan={max_scan} must be >= 1")
    step = getattr(ctx, "step", None)
    active = step is None or ((start_step is None or step >= start_step) and (end_step is None or step <= end_step))
    n = len(batch)
    triggered = [cot_triggered(c, open_tag, close_tag) for c in batch.completions]
    batch.stats["adacot/trigger_rate"] = sum(triggered) / n if n else 0.0
    batch.stats["adacot/slm_active"] = float(active)
    masked, opened = 0, 0
    if active and n:
        tok = getattr(ctx, "tokenizer", None)
        if tok is None:
            raise RuntimeError("selective_loss_mask needs the tokenizer (ctx.tokenizer) to find the decision tokens")

        def decode(ids):
            return tok.decode(ids, skip_special_tokens=True)

        weights = torch.ones_like(batch.completion_mask, dtype=torch.float32)
        lengths = batch.completion_mask.sum(-1).tolist()
        for i in range(n):
            ids = batch.completion_ids[i, : int(lengths[i])].tolist()
            pos, did_open = decision_position(ids, decode, open_tag, max_scan)
            opened += int(did_open)
            if pos is not None:
                weights[i, pos] = 0.0
                masked += 1
        prev = batch.extras.get(TOKEN_LOSS_MASK)
        batch.extras[TOKEN_LOSS_MASK] = weights if prev is None else prev.float() * weights
        batch.stats["adacot/opened_frac"] = opened / n
    batch.stats["adacot/masked_tokens"] = float(masked)
    return batch
