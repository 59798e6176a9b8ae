"""Group-normalised outcome advantages (GRPO and its scalings: Dr. GRPO, Lite PPO) and GPG's rescaled form."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import CONDITION
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import batch_std, group_stats

SCALES = ("group", "batch", "none")
SINGLETONS = ("zero", "raw")


def check_singleton(singleton: str) -> None:
    if singleton not in SINGLETONS:
        raise ValueError(f"algorithm.advantage.singleton={singleton!r} is not one of {list(SINGLETONS)}")


def normalize_rewards(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: str = "group", eps: float = 1e-6, singleton: str = "zero"
) -> torch.Tensor:
    """GRPO's group-relative advantage (DeepSeekMath, 2024): (r - mean_g) / (std + eps).

    ``scale``: ``group`` divides by the group std (GRPO), ``batch`` by the std of all rewards in the
    batch ("Lite PPO": group mean, batch std; Tricks or Traps, 2025), ``none`` only centres
    (Dr. GRPO: Understanding R1-Zero-Like Training, 2025).

    ``singleton``: a group of one completion gets advantage 0 (``zero``, TRL) or is normalised with mean 0 and
    std 1, so its raw reward passes (``raw``, verl's grpo: r/(1 + ε) under ``scale=group``)."""
    if scale not in SCALES:
        raise ValueError(f"advantage scale={scale!r} is not one of {SCALES}")
    check_singleton(singleton)
    mean, std, count = group_stats(rewards, group_ids)
    single = count <= 1
    if singleton == "raw":
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
    adv = rewards.float() - mean
    if scale == "group":
        adv = adv / (std + eps)
    elif scale == "batch":
        adv = adv / (batch_std(rewards) + eps)  # over every process's rows in a distributed step
    return adv if singleton == "raw" else torch.where(single, torch.zeros_like(adv), adv)


@ADVANTAGES.register
def grpo(
    batch: RolloutBatch, scale: str = "group", eps: float = 1e-6, singleton: str = "zero", by_condition: bool = False
) -> torch.Tensor:
    """Group-normalised outcome advantage, one value per completion (``singleton``: see
    :func:`normalize_rewards`). ``by_condition``: normalise within each group's prompt-condition subgroups (the
    completions of one wording of a paraphrase set: Co-Reward normalises its original and rephrased batches apart)."""
    groups = batch.group_ids
    if by_condition:
        condition = batch.extras.get(CONDITION)
        if condition is None:
            raise ValueError("algorithm.advantage.by_condition=true needs algorithm.prompt_condition (none is set)")
        groups = groups.to(condition.device).double() * 1e6 + condition.double()
    return normalize_rewards(batch.reward, groups, scale=scale, eps=eps, singleton=singleton)


@ADVANTAGES.register
def gpg(
    batch: RolloutBatch, scale: str = "none", eps: float = 1e-6, min_valid_frac: float = 0.5, singleton: str = "zero"
) -> torch.Tensor:
    """GPG ("GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning", 2025):
    the group-relative advantage (``scale`` as in :func:`normalize_rewards`) multiplied by
    α = B / M, where M counts the completions in groups with non-zero reward variance — the gradient
    of the zero-advantage groups is redistributed to the rest (the released trainer divides the loss by
    1/α = min(1, informative groups / groups); AMAP-ML/GPG ``open-r1/src/open_r1/gpg_trainer.py``,
    ``adjust_gd``). α is capped at 1 / ``min_valid_frac``: the release resamples (the ``dynamic_sampling``
    stage with ``min_varied_frac``) until 1/α ≥ ``min_inverse_alpha`` (0.5) or raises; the cap is our bound
    for a step whose resampling rounds ran out. (An older commit capped at 1/0.05; verl's ``gpg`` instead
    counts completions with a non-zero reward.)"""
    if not 0.0 < min_valid_frac <= 1.0:
        raise ValueError(f"advantage gpg.min_valid_frac={min_valid_frac} must be in (0, 1]")
    adv = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    _, std, count = group_stats(batch.reward, batch.group_ids)
    valid_frac = float(((std > 0) & (count > 1)).float().mean()) if len(batch) else 1.0
    return adv / max(valid_frac, min_valid_frac)
