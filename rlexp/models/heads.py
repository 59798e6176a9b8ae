"""Small helpers for calling transformers causal LMs."""

from __future__ import annotations

import torch


def last_position(length: int, device) -> torch.Tensor:
    """``logits_to_keep`` for "the last position only", as an index tensor. The int form (1) makes
    transformers slice hidden states to a non-contiguous (N, 1, H) view, which ``F.linear`` cannot fold
    into one matrix product: it broadcasts the LM head into a batched product instead — 285 ms
    against 5 ms for 2 prompts with SmolLM2's 49,152 × 576 head on one CPU thread (bf16). The index
    form gathers a contiguous copy."""
    return torch.tensor([length - 1], device=device)
