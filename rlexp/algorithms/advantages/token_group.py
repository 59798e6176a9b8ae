"""Group normalisation at the token level: HAPO's Token Level Group Average ("From Uniform to Heterogeneous: Tailoring
Policy Optimization to Every Token's Nature", Liu et al., 2025; released code starriver030515/HAPO,
``compute_hapo_outcome_advantage``).

Every valid token of completion i carries its outcome reward r_i; a group's mean and standard deviation are taken
over all its valid tokens rather than over its completions:

    μ_g = Σ_i L_i r_i / Σ_i L_i,   σ_g² = Σ_i L_i (r_i − μ_g)² / Σ_i L_i   (L_i: completion i's valid tokens)
    A_i = (r_i − μ_g) / (σ_g + ε)

so a long completion weighs in its group's baseline as much as its tokens weigh in a token-mean loss. Where a
group's token-level advantage reaches ``max_abs`` (5) in magnitude — one long completion among short ones makes the
token-weighted σ_g small — the group falls back to the sequence-level GRPO advantage (the release's "smooth score").
"""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_index, group_sum


@ADVANTAGES.register
def token_group_average(
    batch: RolloutBatch, scale: str = "group", eps: float = 1e-6, max_abs: float = 5.0, singleton: str = "zero"
) -> torch.Tensor:
    """HAPO's token-level group average: (N, T) advantages (r_i − μ_g) / (σ_g + ε) with the token-weighted group
    mean and (population) std, the group's GRPO advantage where any of its token advantages reaches ``max_abs``.
    ``scale``: ``group`` divides by σ_g (the release's default), ``none`` only centres (its Dr. GRPO switch; the
    fallback then also only centres). ``singleton``: the GRPO fallback's one-completion groups (see ``grpo``).
    Metric: ``hapo/fallback_group_frac``, the share of groups that fell back to the sequence-level advantage."""
    if scale not in ("group", "none"):
        raise ValueError(f"algorithm.advantage.scale={scale!r} is not one of ['group', 'none']")
    if max_abs <= 0:
        raise ValueError(f"algorithm.advantage.max_abs must be > 0, got {max_abs}")
    r = batch.reward.float()
    mask = batch.completion_mask.float()
    L = mask.sum(-1)
    inv, k = group_index(batch.group_ids)
    tokens = group_sum(L, inv, k)
    mean = group_sum(L * r, inv, k) / tokens.clamp(min=1)
    var = group_sum(L * (r - mean[inv]) ** 2, inv, k) / tokens.clamp(min=1)
    centred = r - mean[inv]
    adv = centred / (var.sqrt()[inv] + eps) if scale == "group" else centred
    # the fallback test looks at the group's valid tokens (completions with at least one)
    big = group_sum(((adv.abs() >= max_abs) & (L > 0)).float(), inv, k) > 0
    grpo = normalize_rewards(r, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    adv = torch.where(big[inv], grpo, adv)
    batch.stats["hapo/fallback_group_frac"] = float(big.float().mean()) if k else 0.0
    return adv[:, None] * mask
