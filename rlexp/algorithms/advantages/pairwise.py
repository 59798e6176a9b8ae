"""Pairwise advantages from the step's chosen pairs (``group_stages.preference.PairwisePreference``).

P3O ("Pairwise Proximal Policy Optimization: Harnessing Relative Feedback for LLM Alignment", Wu et al., 2023; arXiv
2310.00212): for two samples y₁, y₂ of a prompt the trajectory-wise gradient is (r(y₁) − r(y₂))·∇(log π(y₁) −
log π(y₂))/2, so each sample's advantage is half its reward's difference to its partner's, ±(r₁ − r₂)/2: no critic,
invariant to any per-prompt shift of the reward. A completion in several pairs gets the mean over its pairs; one in
none, 0.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.group_stages.preference import PAIRS, peer_matrix
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES


@ADVANTAGES.register
def pairwise_difference(batch: RolloutBatch) -> torch.Tensor:
    """(N,) mean over each row's chosen pairs of (r_i − r_partner)/2 (module doc)."""
    pairs = batch.extras.get(PAIRS)
    if pairs is None:
        raise ValueError(
            "algorithm.advantage pairwise_difference reads batch.extras['pairs']: put the group stage "
            "rlexp.algorithms.group_stages.preference.PairwisePreference in algorithm.group_stages"
        )
    reward = batch.reward.float()
    peers, valid = peer_matrix(reward, batch.group_ids)
    partner = (pairs != 0) & valid
    diff = torch.where(partner, (reward[:, None] - peers) / 2.0, torch.zeros_like(peers))
    return diff.sum(-1) / partner.sum(-1).clamp(min=1)
