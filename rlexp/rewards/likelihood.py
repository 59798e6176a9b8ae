"""Reference likelihood of a stated answer given its own reasoning — the confidence signal of
GRPO-CARE ("Consistency-Aware RL for Multimodal Reasoning", 2025) and the *likelihood* consistency
measurement: conf = exp(mean log p(answer tokens | prompt + reasoning)).

The completion is cut at the end of its stated answer; the answer tokens are those whose
characters fall inside the answer span (``rewards.answers.answer_span``), found through the fast
tokenizer's offset mapping, so the tokenisation is the one the model saw.
"""

from __future__ import annotations

import math

import torch

from rlexp.rewards.answers import answer_span


@torch.no_grad()
def answer_confidence(
    model, tokenizer, prompts: list[str], completions: list[str], answer_format: str = "auto", batch_size: int = 16
) -> torch.Tensor:
    """(N,) exp(mean answer-token log-prob); NaN where the completion states no parsable answer."""
    device = next(model.parameters()).device
    out = torch.full((len(prompts),), float("nan"))
    items = []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        span = answer_span(c, answer_format)
        if span is not None and span[1] > span[0]:
            items.append((i, p + c[: span[1]], len(p) + span[0], len(p) + span[1]))
    for k in range(0, len(items), batch_size):
        chunk = items[k : k + batch_size]
        enc = tokenizer(
            [t for _, t, _, _ in chunk],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            return_offsets_mapping=True,
        )
        offsets = enc.pop("offset_mapping")
        enc = enc.to(device)
        positions = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = model(**enc, position_ids=positions, use_cache=False).logits.float()
        logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, enc["input_ids"][:, 1:, None]).squeeze(-1).cpu()
        for row, (i, _, a0, a1) in enumerate(chunk):
            starts, ends = offsets[row, 1:, 0], offsets[row, 1:, 1]
            valid = enc["attention_mask"][row, 1:].bool().cpu()
            in_answer = valid & (ends > a0) & (starts < a1)
            if in_answer.any():
                out[i] = math.exp(float(logp[row][in_answer].mean()))
    return out
