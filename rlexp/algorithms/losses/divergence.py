"""Divergence trust regions in place of the ratio clip: DPPO's binary total-variation and binary KL masks
("Rethinking the Trust Region in LLM Reinforcement Learning", Qi et al., 2026; arXiv 2602.04879), as verl
ships them (``loss_mode=dppo_tv`` / ``dppo_kl``, verl/trainer/ppo/core_algos.py)."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, clamp_log_ratio, expand_like, ratio_stats
from rlexp.core.registry import LOSSES


def _dppo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    inside: torch.Tensor,
    ratio_cap: float | None,
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """ℓ_t = −A·sg(min(r_t, c))·log π_θ·1[inside]: the unclipped PPO gradient A·r·∇log π on the tokens
    inside the trust region, none outside (``inside`` is detached)."""
    if ratio_cap is not None and ratio_cap <= 0:
        raise ValueError(f"DPPO ratio_cap must be > 0 or null, got {ratio_cap}")
    ratio = torch.exp(clamp_log_ratio(logp - old_logp, log_ratio_clamp)).detach()
    weight = ratio if ratio_cap is None else ratio.clamp(max=ratio_cap)
    keep = inside.detach().to(logp.dtype)
    loss = -adv * weight * logp * keep
    outside = ~inside
    stats = ratio_stats(ratio, outside & (adv < 0), outside & (adv > 0))
    truncated = (ratio > ratio_cap) & inside if ratio_cap is not None else torch.zeros_like(inside)
    stats["dppo/masked_frac"] = outside.float()
    stats["dppo/truncated_frac"] = truncated.float()
    return LossOutput(loss, stats)


@LOSSES.register
def dppo_tv(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    delta_low: float = 0.15,
    delta_high: float | None = None,
    ratio_cap: float | None = None,
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """DPPO-Binary-TV (Qi et al., 2026; verl ``dppo_tv``): a token keeps its gradient while the change of its
    own probability stays in the TV trust region — π − π_old ≤ δ_high for A > 0, π − π_old ≥ −δ_low
    otherwise — instead of PPO's ratio band, which over-restricts rare tokens and under-restricts likely
    ones. ℓ_t = −A·sg(min(r_t, c))·log π_θ on kept tokens (gradient A·r·∇log π, PPO's unclipped one), 0
    outside. ``ratio_cap`` c: the truncated-IS cap verl uses in place of dual clip (its example: 1e4, i.e.
    none; its config default 3); null: no cap. ``log_ratio_clamp``: verl's ±c on the log-ratio of the IS weight
    (verl: 20); null: none."""
    adv = expand_like(advantages, logp)
    high = delta_low if delta_high is None else delta_high
    diff = (torch.exp(logp) - torch.exp(old_logp)).detach()
    inside = torch.where(adv > 0, diff <= high, diff >= -delta_low)
    return _dppo(logp, old_logp, adv, inside, ratio_cap, log_ratio_clamp)


@LOSSES.register
def dppo_kl(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    delta_low: float = 0.05,
    delta_high: float | None = None,
    ratio_cap: float | None = None,
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """DPPO-Binary-KL (Qi et al., 2026; verl ``dppo_kl``): as ``dppo_tv`` with the KL divergence of the
    two-outcome distributions (the sampled token vs the rest), D = π_old·log(π_old/π) + (1 − π_old)·
    log((1 − π_old)/(1 − π)) (1e-8 added inside the second log, as verl). A token is kept while D ≤ δ_high
    or its probability went down (A > 0), while D ≤ δ_low or its probability went up (A ≤ 0)."""
    adv = expand_like(advantages, logp)
    high = delta_low if delta_high is None else delta_high
    p, p_old = torch.exp(logp).detach(), torch.exp(old_logp).detach()
    lp, lp_old = logp.detach(), old_logp.detach()
    binary_kl = p_old * (lp_old - lp) + (1 - p_old) * (torch.log(1 - p_old + 1e-8) - torch.log(1 - p + 1e-8))
    inside = torch.where(adv > 0, (binary_kl <= high) | (p <= p_old), (binary_kl <= delta_low) | (p >= p_old))
    return _dppo(logp, old_logp, adv, inside, ratio_cap, log_ratio_clamp)
