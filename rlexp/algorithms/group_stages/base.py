"""Helpers shared by group stages: their settings from the context, the metric they look at, reward columns they
append."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch


def stage_setting(ctx, name: str, default=None):
    settings = getattr(ctx, "settings", None)
    value = getattr(settings, name, None) if settings is not None else None
    return default if value is None else value


def metric_values(batch: RolloutBatch, metric: str | None) -> torch.Tensor:
    if metric in (None, "reward"):
        return batch.reward
    if metric not in batch.reward_names:
        raise KeyError(f"group stage metric={metric!r} is not a reward term (terms: {batch.reward_names})")
    return batch.term(metric)


def refuse_trained_label(batch: RolloutBatch, label_term: str | None, stage: str) -> None:
    """A label-free stage (Co-Reward, RLCCF) refuses a run that also trains on the ground truth: reward term
    ``label_term`` must be absent or at weight 0 (reward=label_free logs accuracy at weight 0)."""
    if label_term is None or label_term not in batch.reward_names:
        return
    weight = float(batch.reward_weights[batch.reward_names.index(label_term)])
    if weight != 0.0:
        raise ValueError(
            f"algorithm.group_stages: {stage} trains without labels, but reward term {label_term!r} has weight "
            f"{weight}: use reward=label_free (accuracy logged at weight 0), or set the stage's label_term=null"
        )


def append_reward_column(batch: RolloutBatch, name: str, scores: torch.Tensor, weight: float = 1.0) -> RolloutBatch:
    """Add a reward column computed by a group stage: raw ``scores`` under ``name`` with ``weight``,
    and ``weight · scores`` added to ``batch.reward``."""
    if batch.rewards is None or batch.reward is None:
        raise RuntimeError(f"reward column {name!r}: the batch has not been scored yet (run after the reward stage)")
    if name in batch.reward_names:
        raise ValueError(
            f"reward column {name!r} already exists (reward terms: {batch.reward_names}); "
            "give the group stage another name or drop the reward term"
        )
    scores = scores.to(device=batch.rewards.device, dtype=batch.rewards.dtype)
    batch.rewards = torch.cat([batch.rewards, scores[:, None]], 1)
    fails = batch.reward_failures
    if fails is None:
        fails = torch.zeros(batch.rewards.shape[0], batch.rewards.shape[1] - 1, dtype=torch.bool, device=scores.device)
    batch.reward_failures = torch.cat([fails, torch.zeros_like(scores, dtype=torch.bool)[:, None]], 1)
    batch.reward_names = [*batch.reward_names, name]
    w = torch.tensor([float(weight)], dtype=batch.rewards.dtype, device=batch.rewards.device)
    batch.reward_weights = w if batch.reward_weights is None else torch.cat([batch.reward_weights, w])
    batch.reward = batch.reward + float(weight) * scores
    return batch
