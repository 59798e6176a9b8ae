"""High-entropy token selection ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", 2025): the policy gradient is kept only on the top-ρ
fraction of tokens by entropy (the paper: ρ = 0.2, the "forking" tokens); the other tokens' policy
loss is multiplied by 0 while they still count in the aggregation's token/row normalisers (TRL's
``top_entropy_quantile``).

The threshold is the (1 − ρ) quantile (linear interpolation, ``torch.quantile``) of the entropies of
the valid tokens of the micro-batch being differentiated — TRL's scope on one process (it gathers
across processes; verl's recipe also works per micro-batch). Tokens with entropy ≥ threshold are kept.
"""

from __future__ import annotations

import torch

from rlexp.core.registry import REGULARISERS


@REGULARISERS.register
def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """(N, T) bool: valid tokens whose entropy is ≥ the (1 − ``top_quantile``) quantile."""
    if not 0.0 < top_quantile <= 1.0:
        raise ValueError(f"algorithm.top_entropy_quantile={top_quantile} must be in (0, 1]")
    valid = mask.bool()
    if not valid.any():
        return torch.zeros_like(valid)
    if top_quantile >= 1.0:
        return valid
    threshold = torch.quantile(entropy.detach()[valid].float(), 1.0 - top_quantile)
    return (entropy.detach() >= threshold) & valid
