"""Sequence-level ratio losses: GSPO's length-normalised sequence ratio and GMPO's geometric mean."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats, seq_mean
from rlexp.core.registry import LOSSES


@LOSSES.register
def gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """GSPO ("Group Sequence Policy Optimization", 2025), the GSPO-token form: the sequence ratio
    s_i = exp(mean_t log r_t) (length-normalised) is clipped to [1 − ε_low, 1 + ε_high]; per token
    s_i,t = sg[s_i]·π_θ/sg[π_θ] carries the value of s_i and the gradient s_i·∇log π_θ. With one
    advantage per sequence this equals TRL's ``importance_sampling_level="sequence"`` in value and
    gradient. ``log_ratio_clamp`` c: the sequence log-ratio is clamped from above at c, no gradient past it
    (verl: 10); null: none (TRL). Use with seq-mean-token-mean; with
    seq-mean-token-sum (each sequence's loss times its length) it is LUSPO (2026; TRL's ``luspo``)."""
    adv = expand_like(advantages, logp)
    if log_ratio_clamp is not None and log_ratio_clamp <= 0:
        raise ValueError(f"algorithm.loss.log_ratio_clamp must be > 0 or null, got {log_ratio_clamp}")
    log_seq = seq_mean(logp - old_logp, mask).detach()
    log_ratio = logp - logp.detach() + log_seq.unsqueeze(-1)
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(max=log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    seq_ratio = torch.exp(log_seq).unsqueeze(-1).expand_as(logp)
    return LossOutput(
        loss, ratio_stats(seq_ratio, (seq_ratio < 1 - eps_low) & (adv < 0), (seq_ratio > 1 + eps_high) & (adv > 0))
    )


@LOSSES.register
def gmpo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
) -> LossOutput:
    """GMPO ("GMPO: Geometric-Mean Policy Optimization", 2025): the sequence objective uses the
    geometric mean of the token ratios, clipped token-wise in log space to [−ε_low, ε_high]
    (pessimistically w.r.t. sign(A)): ℓ_i = −A_i·exp(mean_t sgn(A)·min(sgn(A)·log r_t,
    sgn(A)·clip(log r_t))). Every token of a row carries ℓ_i, so seq-mean-token-mean aggregation gives
    mean_i ℓ_i. The advantage is the row's token mean (sequence-level, as verl's ``geo_mean``)."""
    adv_tok = expand_like(advantages, logp)
    sgn = torch.sign(adv_tok)
    log_ratio = logp - old_logp
    clamped = log_ratio.clamp(-eps_low, eps_high)
    pessimistic = sgn * torch.min(sgn * log_ratio, sgn * clamped)
    seq_ratio = torch.exp(seq_mean(pessimistic, mask))
    seq_adv = seq_mean(adv_tok, mask)
    loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(logp)
    clipped = log_ratio != clamped
    return LossOutput(loss, ratio_stats(torch.exp(log_ratio), clipped & (adv_tok < 0), clipped & (adv_tok > 0)))
