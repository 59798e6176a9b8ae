"""Small hand-made RolloutBatches for the algorithm unit tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlexp.core.batch import RolloutBatch


def make_batch(rewards, groups, lengths=None, width=None, truncated=None, terms=None, weights=None) -> RolloutBatch:
    """One row per group id. ``rewards``: the total per row (ignored when ``terms``, (N, R) per-term
    scores, are given: the total is then their weighted sum); ``lengths``: valid completion tokens per
    row (default 2)."""
    n = len(groups)
    lengths = [2] * n if lengths is None else list(lengths)
    width = width or max(max(lengths), 1)
    pos = torch.arange(width)[None, :]
    mask = (pos < torch.tensor(lengths)[:, None]).long()
    if terms is None:
        scores = torch.tensor(rewards, dtype=torch.float32)[:, None]
        names, w = ["r"], torch.ones(1)
    else:
        scores = torch.tensor(terms, dtype=torch.float32)
        names = [f"t{j}" for j in range(scores.shape[1])]
        w = torch.tensor(weights if weights is not None else [1.0] * scores.shape[1], dtype=torch.float32)
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 3, dtype=torch.long),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.full((n, width), 5, dtype=torch.long) * mask,
        completion_mask=mask,
        sampling_logprobs=torch.zeros(n, width),
        truncated=torch.tensor(truncated or [False] * n),
        group_ids=torch.tensor(groups),
        prompts=[f"p{g}" for g in groups],
        completions=["c"] * n,
        records=[{"question": f"q{g}", "answer": "1"} for g in groups],
    )
    batch.rewards, batch.reward_names, batch.reward_weights = scores, names, w
    batch.reward_failures = torch.zeros_like(scores, dtype=torch.bool)
    batch.reward = torch.tensor(rewards, dtype=torch.float32) if terms is None else scores @ w
    return batch


def tiny_policy(seed=0, layers=1, tied=False):
    """A ``layers``-layer Llama over a 32-token vocabulary (no tokenizer needed); ``tied``: the head is the
    embedding."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(cfg)


def token_batch(seed=0, n_groups=None, g=2):
    """Four rows (groups of two) with random prompt/completion ids < 32 and lengths 4, 2, 1, 3; with
    ``n_groups``, that many groups of ``g`` rows with random lengths 1..4 instead."""
    gen = torch.Generator().manual_seed(seed)
    if n_groups is None:
        b = make_batch([1.0, 0.0, 1.0, 0.5], [0, 0, 1, 1], lengths=[4, 2, 1, 3], width=4)
        b.prompt_ids = torch.randint(1, 32, (4, 3), generator=gen)
        b.prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 1]])
    else:
        n = n_groups * g
        lengths = torch.randint(1, 5, (n,), generator=gen).tolist()
        groups = [i // g for i in range(n)]
        b = make_batch([float(i % 2) for i in range(n)], groups, lengths=lengths, width=4)
        prompts = torch.randint(1, 32, (n_groups, 3), generator=gen)
        b.prompt_ids = prompts.repeat_interleave(g, 0)
    b.completion_ids = torch.randint(1, 32, (len(b), 4), generator=gen) * b.completion_mask
    return b
