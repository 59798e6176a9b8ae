"""Stratified Advantage Normalization (SAN) — "Stratified GRPO: Handling Structural Heterogeneity in
Reinforcement Learning of LLM Search Agents" (Zhu et al., 2025; arXiv 2510.06214).

A prompt's completions are split into strata by a structural property (the paper: the number of search
calls); each completion is normalised against its own stratum only, A_S = (R − mean_k) / (std_k + ε), which
removes the cross-stratum offset (mean_k − mean_group) that GRPO's single group baseline adds to every member of
stratum k. For finite-sample stability A = α·A_S + (1 − α)·A_G, A_G the group-normalised (GRPO) advantage."""

from __future__ import annotations

import re

import torch

from rlexp.algorithms.advantages.group import check_singleton, normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_index, group_stats


def strata_by_count(completions: list[str], pattern: str, max_stratum: int) -> torch.Tensor:
    """(N,) stratum of each completion: the number of non-overlapping matches of ``pattern``, capped at
    ``max_stratum`` (every count above it shares the last stratum)."""
    rx = re.compile(pattern)
    return torch.tensor([min(len(rx.findall(c)), max_stratum) for c in completions], dtype=torch.long)


@ADVANTAGES.register
def stratified(
    batch: RolloutBatch,
    pattern: str = r"<search>",
    max_stratum: int = 3,
    blend: float = 0.5,
    scale: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> torch.Tensor:
    """α·SAN + (1 − α)·GRPO (``blend`` = α; 1: pure SAN, 0: GRPO). A stratum of one completion has SAN advantage 0
    (it has no peer to be compared with); ``scale`` and ``singleton`` apply to the group estimator as in GRPO
    (:func:`rlexp.algorithms.advantages.group.normalize_rewards`)."""
    if not 0.0 <= blend <= 1.0:
        raise ValueError(f"algorithm.advantage.blend={blend} must be in [0, 1]")
    if max_stratum < 0:
        raise ValueError(f"algorithm.advantage.max_stratum={max_stratum} must be >= 0")
    if not isinstance(pattern, str):
        raise ValueError(f"algorithm.advantage.pattern={pattern!r} must be a regular expression string (quote it)")
    check_singleton(singleton)
    stratum = strata_by_count(batch.completions, pattern, max_stratum).to(batch.reward.device)
    inv, _ = group_index(batch.group_ids.to(batch.reward.device))
    key = inv * (max_stratum + 1) + stratum  # one id per (group, stratum)
    a_group = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    a_strat = normalize_rewards(batch.reward, key, eps=eps, singleton="zero")
    if len(batch):
        g_mean, _, _ = group_stats(batch.reward, batch.group_ids)
        s_mean, _, _ = group_stats(batch.reward, key)
        n_keys = torch.unique(key).numel()
        batch.stats["stratified/strata_per_group"] = n_keys / max(torch.unique(inv).numel(), 1)
        batch.stats["stratified/cross_stratum_bias_abs"] = float((s_mean - g_mean).abs().mean())
    return blend * a_strat + (1.0 - blend) * a_group
