"""Per-token policy losses: ``loss(logp, old_logp, advantages, mask) -> LossOutput``.

``logp`` are the current policy's log-probs of the sampled tokens (N, T), ``old_logp`` those of the
policy that sampled them (equal to ``logp.detach()`` on-policy), ``advantages`` (N,) or (N, T).
Token statistics (clip indicators, ratios) come back per token so the trainer can reduce them over
the whole batch, independent of micro-batching.

Conventions: no log-ratio clamps anywhere (TRL; verl clamps to ±20, GSPO's sequence log-ratio at 10);
a loss that needs batch statistics (Clip-Cov, KL-Cov covariances) takes them over the micro-batch
(verl). Losses: ppo_clip (+ clip-higher, dual clip), gspo, cispo, sapo, clip_cov, kl_cov, gmpo,
reinforce. See CONVENTIONS.md beside this file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    per_token: torch.Tensor                      # (N, T) loss per token, before aggregation
    token_stats: dict[str, torch.Tensor] = field(default_factory=dict)  # (N, T) values to average over the mask


def _expand(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def ppo_clip(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             eps_low: float = 0.2, eps_high: float | None = None, dual_clip: float | None = None) -> LossOutput:
    """PPO clipped surrogate (Proximal Policy Optimization Algorithms, 2017) as used by GRPO
    (DeepSeekMath, 2024), with asymmetric clip-higher ε_low/ε_high (DAPO, 2025) and optional dual
    clip ``c`` that caps the loss of negative-advantage tokens at c·|A| (Dual-Clip PPO, 2019).
    No log-ratio clamp (TRL's convention)."""
    eps_high = eps_low if eps_high is None else eps_high
    adv = _expand(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(adv < 0, torch.min(loss, -dual_clip * adv), loss)
    low = ((ratio < 1 - eps_low) & (adv < 0)).float()
    high = ((ratio > 1 + eps_high) & (adv > 0)).float()
    stats = {"clip/low_frac": low, "clip/high_frac": high, "clip/region_frac": torch.clamp(low + high, max=1),
             "ratio/mean": ratio.detach()}
    return LossOutput(loss, stats)


def _ratio_stats(ratio: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> dict[str, torch.Tensor]:
    low, high = low.float(), high.float()
    return {"clip/low_frac": low, "clip/high_frac": high, "clip/region_frac": torch.clamp(low + high, max=1),
            "ratio/mean": ratio.detach()}


def _seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1)


def gspo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         eps_low: float = 3e-4, eps_high: float = 4e-4) -> LossOutput:
    """GSPO ("Group Sequence Policy Optimization", 2025), the GSPO-token form: the sequence ratio
    s_i = exp(mean_t log r_t) (length-normalised) is clipped to [1 − ε_low, 1 + ε_high]; per token
    s_i,t = sg[s_i]·π_θ/sg[π_θ] carries the value of s_i and the gradient s_i·∇log π_θ. With one
    advantage per sequence this equals TRL's ``importance_sampling_level="sequence"`` in value and
    gradient. No clamp of the log-ratio (verl clamps it at 10). Use with seq-mean-token-mean."""
    adv = _expand(advantages, logp)
    log_seq = _seq_mean(logp - old_logp, mask).detach()
    ratio = torch.exp(logp - logp.detach() + log_seq.unsqueeze(-1))
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    seq_ratio = torch.exp(log_seq).unsqueeze(-1).expand_as(logp)
    return LossOutput(loss, _ratio_stats(seq_ratio, (seq_ratio < 1 - eps_low) & (adv < 0),
                                         (seq_ratio > 1 + eps_high) & (adv > 0)))


def cispo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
          eps_low: float | None = None, eps_high: float = 4.0) -> LossOutput:
    """CISPO ("MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", 2025):
    REINFORCE with a clipped, stop-gradient importance weight, ℓ_t = −sg(clip(r_t, 1 − ε_low,
    1 + ε_high))·A·log π_θ — every token keeps a gradient. ``eps_low=None`` leaves the ratio
    unbounded below (the paper's ε_low is large). TRL's ``epsilon_high`` for cispo is the absolute cap
    1 + ε_high here (ε_high = 4 ⇔ TRL 5.0, ScaleRL's value)."""
    adv = _expand(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    lo = None if eps_low is None else 1 - eps_low
    weight = ratio.clamp(min=lo, max=1 + eps_high)
    loss = -weight * adv * logp
    low = (ratio < lo) & (adv < 0) if lo is not None else torch.zeros_like(ratio, dtype=torch.bool)
    return LossOutput(loss, _ratio_stats(ratio, low, (ratio > 1 + eps_high) & (adv > 0)))


def sapo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         tau_pos: float = 1.0, tau_neg: float = 1.05) -> LossOutput:
    """SAPO ("Soft Adaptive Policy Optimization", 2025): the hard clip is replaced by a soft gate,
    ℓ_t = −f(r_t)·A with f(r) = σ(τ(r − 1))·4/τ, τ = τ_pos for A > 0 and τ_neg otherwise. f'(1) = 1,
    so on-policy the gradient equals the unclipped surrogate's; away from r = 1 it decays smoothly.
    No log-ratio clamp (verl clamps it to ±20)."""
    adv = _expand(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    return LossOutput(-gate * adv, _ratio_stats(ratio, zero, zero))


def _token_cov(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Centred product (A − mean A)(log π − mean log π) per token, means over the valid tokens."""
    m = mask.bool()
    count = m.sum().clamp(min=1)
    a_mean = (adv * m).sum() / count
    l_mean = (logp.detach() * m).sum() / count
    return (adv - a_mean) * (logp.detach() - l_mean)


def clip_cov(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             eps_low: float = 0.2, eps_high: float = 0.2, clip_ratio: float = 2e-4, cov_lb: float = 1.0,
             cov_ub: float = 5.0, generator: torch.Generator | None = None) -> LossOutput:
    """Clip-Cov ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    2025): among the tokens the PPO clip leaves unclipped, those whose centred covariance
    (A − Ā)(log π − mean log π) lies in (cov_lb, cov_ub) are candidates; ⌊clip_ratio·#tokens⌋ (≥ 1)
    of them, drawn at random, get no gradient (loss × 0). Statistics are over the micro-batch (verl)."""
    adv = _expand(advantages, logp)
    ratio = torch.exp(logp - old_logp)
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    valid = mask.bool()
    clipped_by_ppo = (l2 > l1) & valid
    cov = _token_cov(logp, adv, mask)
    candidates = ((cov > cov_lb) & (cov < cov_ub) & valid & ~clipped_by_ppo).nonzero()
    keep = torch.ones_like(ratio)
    n = max(int(clip_ratio * int(valid.sum())), 1)
    if len(candidates):
        perm = torch.randperm(len(candidates), generator=generator, device="cpu")[:n].to(candidates.device)
        chosen = candidates[perm]
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = torch.maximum(l1, l2) * keep
    stats = _ratio_stats(ratio, (ratio < 1 - eps_low) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0))
    stats["cov/detached_frac"] = (keep == 0).float()
    return LossOutput(loss, stats)


def kl_cov(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
           kl_ratio: float = 2e-3, kl_coef: float = 1.0) -> LossOutput:
    """KL-Cov (same paper): unclipped surrogate −A·r_t, plus a penalty kl_coef·|log r_t| on the
    ⌊kl_ratio·#tokens⌋ (≥ 1) valid tokens with the largest centred covariance
    (A − Ā)(log π − mean log π). Statistics are over the micro-batch (verl)."""
    adv = _expand(advantages, logp)
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    loss = -adv * ratio
    valid = mask.bool()
    penalised = torch.zeros_like(ratio)
    if valid.any():
        cov = _token_cov(logp, adv, mask).masked_fill(~valid, float("-inf"))
        k = max(int(kl_ratio * int(valid.sum())), 1)
        top = torch.topk(cov.flatten(), k).indices
        penalised.view(-1)[top] = 1.0
        loss = loss + penalised * kl_coef * log_ratio.abs()
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    stats = _ratio_stats(ratio, zero, zero)
    stats["cov/penalised_frac"] = penalised
    return LossOutput(loss, stats)


def gmpo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         eps_low: float = 0.4, eps_high: float = 0.4) -> LossOutput:
    """GMPO ("GMPO: Geometric-Mean Policy Optimization", 2025): the sequence objective uses the
    geometric mean of the token ratios, clipped token-wise in log space to [−ε_low, ε_high]
    (pessimistically w.r.t. sign(A)): ℓ_i = −A_i·exp(mean_t sgn(A)·min(sgn(A)·log r_t,
    sgn(A)·clip(log r_t))). Every token of a row carries ℓ_i, so seq-mean-token-mean aggregation gives
    mean_i ℓ_i. The advantage is the row's token mean (sequence-level, as verl's ``geo_mean``)."""
    adv_tok = _expand(advantages, logp)
    sgn = torch.sign(adv_tok)
    log_ratio = logp - old_logp
    clamped = log_ratio.clamp(-eps_low, eps_high)
    pessimistic = sgn * torch.min(sgn * log_ratio, sgn * clamped)
    seq_ratio = torch.exp(_seq_mean(pessimistic, mask))
    seq_adv = _seq_mean(adv_tok, mask)
    loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(logp)
    clipped = log_ratio != clamped
    return LossOutput(loss, _ratio_stats(torch.exp(log_ratio), clipped & (adv_tok < 0), clipped & (adv_tok > 0)))


def reinforce(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> LossOutput:
    """Plain REINFORCE ("Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning", Williams 1992): ℓ_t = −A·log π_θ. On-policy only (ignores old_logp,
    which is reported as ratio statistics); also GPG's and ReMax's loss."""
    adv = _expand(advantages, logp)
    ratio = torch.exp(logp - old_logp).detach()
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    return LossOutput(-adv * logp, _ratio_stats(ratio, zero, zero))
