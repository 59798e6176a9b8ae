"""Entropy-weighted rewards: GTPO (per token) and GRPO-S (per sequence) — "GTPO and GRPO-S: Token and Sequence-Level
Reward Shaping with Policy Entropy" (Tan, Pan et al., 2025; arXiv 2508.04349), "Dynamic Entropy Weighting".

Within each group, O⁺ are the completions whose ``metric`` reaches ``positive_min`` (the correct ones), O⁻ the rest;
H_{i,t} is the sampling-time (old) policy's entropy at token t of completion i (``batch.extras["token_entropy"]``, no
gradient). ε = 1e-8 in every denominator (the paper's Remark 2.1).

GTPO, per position t over the group's completions still running at t (d_t of them in O⁺, h_t in O⁻):
    r̃⁺_{i,t} = α₁·r_i + α₂ · H_{i,t} / Σ_{k∈O⁺} H_{k,t} · d_t
    r̃⁻_{j,t} = −α₁ − α₂ · H_{j,t}⁻¹ / Σ_{k∈O⁻} H_{k,t}⁻¹ · h_t
so at each position the correct completions' shaped rewards sum to α₁·Σr + α₂·d_t (the paper's conservation), the
high-entropy tokens of correct completions get more, the confident tokens of wrong ones are punished more. The
advantages normalise the shaped token rewards (``normalise``): ``split`` — O⁺ tokens and O⁻ tokens of the group
apart, (r̃ − mean)/std over each set (Eq. 6 as two independent reproductions read it); ``joint`` — all the group's
tokens together (our alternative; ``split`` centres each set on 0, so the signal left is the entropy contrast within
correct and within wrong completions).

GRPO-S, per completion with Ĥ_i its mean token entropy (n = |O⁺|, m = |O⁻| of the group):
    r̂⁺_i = β₁·r_i + β₂ · Ĥ_i / Σ_{k∈O⁺} Ĥ_k · n,    r̂⁻_j = −β₁ − β₂ · Ĥ_j⁻¹ / Σ_{k∈O⁻} Ĥ_k⁻¹ · m
then GRPO's group normalisation of r̂.

A group without both outcomes gets advantage 0 (our choice, as GRPO gives a group of equal rewards).
"""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_ENTROPY
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import batch_mean, batch_std, group_index, group_stats

EPS = 1e-8
NORMALISE = ("split", "joint")


def _outcome(batch: RolloutBatch, metric: str | None, positive_min: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) rewards r_i and (N,) bool: the row is in O⁺."""
    if metric in (None, "reward"):
        values = batch.reward
    elif metric in batch.reward_names:
        values = batch.term(metric)
    else:
        raise KeyError(f"algorithm.advantage.metric={metric!r} is not a reward term (terms: {batch.reward_names})")
    return batch.reward.float(), values.float() >= positive_min


def _token_entropy(batch: RolloutBatch) -> torch.Tensor:
    h = batch.extras.get(TOKEN_ENTROPY)
    if h is None:
        raise ValueError(
            "an entropy-weighted advantage needs batch.extras['token_entropy'] (the trainer computes it for an "
            "advantage marked token_entropy = True)"
        )
    return h.float()


def _both_outcomes(positive: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    """(N,) bool: the row's group holds correct and wrong completions."""
    pos = torch.zeros(k, device=positive.device).index_add_(0, inv, positive.float())
    size = torch.zeros(k, device=positive.device).index_add_(0, inv, torch.ones_like(positive, dtype=torch.float))
    return ((pos > 0) & (pos < size))[inv]


def _share(weight: torch.Tensor, members: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    """weight / Σ weight · count over the row's group members at each position (``members``: (N, T) or (N,) 0/1)."""
    w = weight * members
    total = torch.zeros((k, *w.shape[1:]), device=w.device, dtype=w.dtype).index_add_(0, inv, w)
    count = torch.zeros_like(total).index_add_(0, inv, members.to(w.dtype))
    return w / (total[inv] + EPS) * count[inv]


def _set_normalise(values: torch.Tensor, members: torch.Tensor, inv: torch.Tensor, k: int) -> torch.Tensor:
    """(values − mean) / (std + ε) over each group's ``members`` tokens (population std), 0 elsewhere."""
    m = members.float()
    flat = lambda x: torch.zeros(k, device=x.device, dtype=x.dtype).index_add_(0, inv, x.sum(-1))  # noqa: E731
    n = flat(m).clamp(min=1)
    mean = flat(values * m) / n
    var = flat(((values - mean[inv][:, None]) ** 2) * m) / n
    return (values - mean[inv][:, None]) / (var.sqrt()[inv][:, None] + EPS) * m


@ADVANTAGES.register
def gtpo(
    batch: RolloutBatch,
    alpha1: float = 1.0,
    alpha2: float = 0.1,
    metric: str | None = None,
    positive_min: float = 1.0,
    normalise: str = "split",
) -> torch.Tensor:
    """(N, T) GTPO token advantages from entropy-weighted token rewards (see the module doc)."""
    if normalise not in NORMALISE:
        raise ValueError(f"algorithm.advantage.normalise={normalise!r} is not one of {list(NORMALISE)}")
    reward, positive = _outcome(batch, metric, positive_min)
    h = _token_entropy(batch)
    mask = batch.completion_mask.float()
    inv, k = group_index(batch.group_ids)
    pos_tok = mask * positive[:, None]
    neg_tok = mask * (~positive)[:, None]
    shaped_pos = alpha1 * reward[:, None] + alpha2 * _share(h, pos_tok, inv, k)
    shaped_neg = -alpha1 - alpha2 * _share(1.0 / (h + EPS), neg_tok, inv, k)
    shaped = torch.where(positive[:, None], shaped_pos, shaped_neg) * mask
    if normalise == "split":
        adv = _set_normalise(shaped, pos_tok, inv, k) + _set_normalise(shaped, neg_tok, inv, k)
    else:
        adv = _set_normalise(shaped, mask, inv, k)
    base = torch.where(positive, alpha1 * reward, torch.full_like(reward, -alpha1))[:, None]
    batch.stats["gtpo/shaping_abs"] = float(((shaped - base).abs() * mask).sum() / mask.sum().clamp(min=1))
    return adv * _both_outcomes(positive, inv, k)[:, None]


gtpo.token_entropy = True  # reads batch.extras["token_entropy"] (Algorithm.advantage_needs_entropy)


@ADVANTAGES.register
def grpo_s(
    batch: RolloutBatch,
    beta1: float = 1.0,
    beta2: float = 0.1,
    metric: str | None = None,
    positive_min: float = 1.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(N,) GRPO-S advantages: GRPO's group normalisation of the entropy-weighted sequence rewards."""
    reward, positive = _outcome(batch, metric, positive_min)
    mask = batch.completion_mask.float()
    h_seq = (_token_entropy(batch) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    inv, k = group_index(batch.group_ids)
    pos, neg = positive.float(), (~positive).float()
    shaped = torch.where(
        positive,
        beta1 * reward + beta2 * _share(h_seq, pos, inv, k),
        -beta1 - beta2 * _share(1.0 / (h_seq + EPS), neg, inv, k),
    )
    mean, std, _ = group_stats(shaped, batch.group_ids)
    base = torch.where(positive, beta1 * reward, torch.full_like(reward, -beta1))
    batch.stats["grpo_s/shaping_abs"] = float((shaped - base).abs().mean())
    return (shaped - mean) / (std + eps) * _both_outcomes(positive, inv, k)


grpo_s.token_entropy = True


LEVELS = ("sequence", "token")


@ADVANTAGES.register
def egsw(
    batch: RolloutBatch,
    alpha: float = 0.5,
    temperature: float = 1.0,
    level: str = "sequence",
    eps: float = 1e-6,
) -> torch.Tensor:
    """EGSW ("Entropy-guided sequence weighting for efficient exploration in RL-based LLM fine-tuning", Vanlioglu,
    2025; arXiv 2503.22456): GRPO's advantage A_i reweighted by w = softmax over the group of (A + α·H) / P — the
    high-reward, high-uncertainty completions weigh most. ``level=sequence`` (trajectory-wise): H the completion's mean
    token entropy, one weight per completion; ``level=token`` (step-wise): H_{i,t} per token, the softmax over the
    group's completions still running at t. The weights are scaled by the number of completions they are spread over
    (our choice), so uniform weights give GRPO's advantage back. Entropies: the old policy's (no gradient)."""
    if level not in LEVELS:
        raise ValueError(f"algorithm.advantage.level={level!r} is not one of {list(LEVELS)}")
    if temperature <= 0:
        raise ValueError(f"algorithm.advantage.temperature={temperature} must be > 0")
    mean, std, _ = group_stats(batch.reward, batch.group_ids)
    adv = (batch.reward.float() - mean) / (std + eps)
    mask = batch.completion_mask.float()
    h = _token_entropy(batch) * mask
    inv, k = group_index(batch.group_ids)
    if level == "sequence":
        score = (adv + alpha * h.sum(-1) / mask.sum(-1).clamp(min=1)) / temperature
        top = torch.full((k,), float("-inf"), device=score.device).scatter_reduce(0, inv, score, "amax")
        e = torch.exp(score - top[inv])
        total = torch.zeros(k, device=e.device).index_add_(0, inv, e)
        count = torch.zeros(k, device=e.device).index_add_(0, inv, torch.ones_like(e))
        w = e / total[inv] * count[inv]
        batch.stats["egsw/weight_max"] = float(w.max())
        return adv * w
    score = ((adv[:, None] + alpha * h) / temperature).masked_fill(mask == 0, float("-inf"))
    top = torch.full((k, score.shape[1]), float("-inf"), device=score.device).scatter_reduce(
        0, inv[:, None].expand_as(score), score, "amax"
    )
    e = torch.exp(score - top[inv]).nan_to_num(0.0) * mask
    total = torch.zeros_like(top).index_add_(0, inv, e)
    count = torch.zeros_like(top).index_add_(0, inv, mask)
    w = e / total[inv].clamp(min=1e-30) * count[inv]
    batch.stats["egsw/weight_max"] = float(w.max())
    return adv[:, None] * w


egsw.token_entropy = True


@ADVANTAGES.register
def aepo(
    batch: RolloutBatch,
    alpha: float = 0.2,
    scale: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> torch.Tensor:
    """(N, T) AEPO's entropy-aware advantage ("Agentic Entropy-Balanced Policy Optimization", Dong et al., 2025; arXiv
    2510.14545): GRPO's advantage A_i (``scale``, ``eps``, ``singleton`` as ``grpo``) times 1 + α·z_{i,t}, with z the
    token entropy standardised over the batch's valid tokens, z = (H − mean) / std (Bessel std; a zero std counts as
    1, as the released code; we also count a std below 1e-6, the rounding of equal entropies, as 1), so
    high-uncertainty tokens get a larger share of the update and confident ones a smaller one, whatever the sign of A.
    α = 0.2 in the released code (``enable_entropy_balanced_advantage`` in
    ``compute_policy_loss_entropy_balanced_clipping``). There the entropies are the training forward's, standardised
    over each micro-batch; ours are those of the policy the update starts from (``batch.extras["token_entropy"]``,
    the same as the first optimiser step's), standardised over the whole rollout batch, so micro-batching does not
    change them. Stat: ``aepo/entropy_adv_abs_mean``, the mean |A·α·z| over valid tokens (the entropy term's part)."""
    if alpha < 0:
        raise ValueError(f"algorithm.advantage.alpha={alpha} must be >= 0")
    adv = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    mask = batch.completion_mask.float()
    h = _token_entropy(batch)
    valid = h[mask.bool()]
    mean, std = batch_mean(valid), batch_std(valid)  # over every process's tokens in a distributed step
    std = torch.where(std > 1e-6, std, torch.ones_like(std))  # equal entropies (up to rounding): z = 0
    z = (h - mean) / std * mask
    shift = adv[:, None] * alpha * z
    batch.stats["aepo/entropy_adv_abs_mean"] = float(shift.abs().sum() / mask.sum().clamp(min=1))
    return (adv[:, None] + shift) * mask


aepo.token_entropy = True
