"""Advantages with outliers removed: StableReinforce's Advantage Filter ("R1-Reward: Training Multimodal Reward Model
Through Stable Reinforcement Learning", 2025)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.reinforce import reinforce_pp
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES


def sigma_filter(advantages: torch.Tensor, mask: torch.Tensor, sigma: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the whitened advantages outside [−sigma, sigma] (the 3-sigma rule on standardised values); returns the
    filtered advantages and the (N, T) bool of valid tokens it zeroed."""
    valid = mask.bool()
    out_of_range = (advantages.abs() > sigma) & valid
    return torch.where(out_of_range, torch.zeros_like(advantages), advantages), out_of_range


@ADVANTAGES.register
def stable_reinforce(batch: RolloutBatch, gamma: float = 1.0, eps: float = 1e-8, sigma: float = 3.0) -> torch.Tensor:
    """StableReinforce's advantage: REINFORCE++'s token returns whitened over the batch (``reinforce_pp``, with the
    KL penalty of ``algorithm.kl.mode=reward`` in the reward), then the Advantage Filter — tokens whose standardised
    advantage lies beyond ±``sigma`` get advantage 0, so a batch with a few rare rewards (nearly all 1 or all 0)
    cannot hand those few samples huge advantages. Stats: ``stable_reinforce/filtered_frac`` (share of valid tokens
    zeroed). The released code (yfzhang114/r1_reward, ``replay_buffer.normalize``) whitens with the population
    variance and compares the whitened values with (raw mean ± 3); we keep reinforce_pp's whitening (Bessel,
    rsqrt(var + 1e-8)) and the symmetric window ±sigma of the 3-sigma rule."""
    if sigma <= 0:
        raise ValueError(f"advantage stable_reinforce.sigma must be > 0, got {sigma}")
    adv = reinforce_pp(batch, gamma=gamma, eps=eps)
    mask = batch.completion_mask
    filtered, dropped = sigma_filter(adv, mask, sigma)
    batch.stats["stable_reinforce/filtered_frac"] = float(dropped.sum()) / max(float(mask.sum()), 1.0)
    return filtered * mask
