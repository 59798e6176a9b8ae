"""Advantage-filtered off-policy gradients: A-LoL ("Leftover Lunch: Advantage-based Offline Reinforcement
Learning for Language Models", Baheti et al., 2023; ICLR 2024; arXiv 2305.14718)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.registry import LOSSES

LEVELS = ("sequence", "token")


@LOSSES.register
def a_lol(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.9,
    level: str = "sequence",
) -> LossOutput:
    """A-LoL: ℓ_t = −A⁺·sg(clip(w, 1 − ε, 1 + ε))·log π_θ(y_t), A⁺ = max(A, 0) (data with a negative advantage is
    dropped). ``level=sequence`` (A-LoL): w = π_θ(y)/π_ref(y), the whole completion one action, the ratio of
    sequence likelihoods exp Σ_t (log π_θ − log π_ref); ``level=token`` (A-LoL seq.): w_t per token. The weight
    carries no gradient and ε = 0.9 (the released code, abaheti95/LoL-RL lolrl_qlora_llama_hh.py ``ppo_clip``).
    π_ref is the policy the data came from: here ``old_logp``, the rollout's policy (see conf/algorithm/a_lol.yaml).
    Sum the token losses per completion (``aggregation: seq-mean-token-sum``, as the released code)."""
    if level not in LEVELS:
        raise ValueError(f"loss a_lol level={level!r} is not one of {list(LEVELS)}")
    if not 0.0 < clip < 1.0:
        raise ValueError(f"loss a_lol clip={clip} must be in (0, 1)")
    adv = expand_like(advantages.float(), logp)
    log_r = (logp - old_logp).detach()
    if level == "sequence":
        if advantages.dim() != 1:
            raise ValueError("loss a_lol level=sequence needs one advantage per sequence (N,)")
        seq = (log_r * mask.to(log_r.dtype)).sum(-1)
        ratio = torch.exp(seq)[:, None].expand_as(logp)
    else:
        ratio = torch.exp(log_r)
    weight = ratio.clamp(1.0 - clip, 1.0 + clip)
    kept = adv > 0
    per_token = -torch.where(kept, adv, torch.zeros_like(adv)) * weight * logp
    stats = {
        "a_lol/dropped_frac": (~kept).float(),
        "a_lol/clipped_frac": ((ratio < 1.0 - clip) | (ratio > 1.0 + clip)).float() * kept.float(),
        "ratio/mean": ratio,
    }
    return LossOutput(per_token, stats)
