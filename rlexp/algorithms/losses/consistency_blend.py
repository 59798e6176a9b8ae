"""COPO's blended loss ("COPO: Consistency-Aware Policy Optimization", 2025; arXiv 2508.04138): a per-completion mix
of the PPO-clipped loss on the local (group-relative) advantage and the PPO-clipped loss on the group's global
advantage, ℓ_t = w_i·ℓ_clip(A^loc_i) + (1 − w_i)·ℓ_clip(A^glob_i), both with the same ratio. The advantage estimator
:func:`rlexp.algorithms.advantages.consistency_aware.copo` writes A^glob and w to ``batch.extras``. Released code:
hijih/copo-code ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_with_global``."""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, uses_batch_extras
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.core.registry import LOSSES

GLOBAL_ADV = "copo_global_adv"  # (N,) the group's global advantage (advantages.consistency_aware.copo)
LOCAL_WEIGHT = "copo_local_weight"  # (N,) w_i, the local loss's weight; 1 − w_i weighs the global loss


@LOSSES.register
@uses_batch_extras(GLOBAL_ADV, LOCAL_WEIGHT)
def copo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    copo_global_adv: torch.Tensor | None = None,
    copo_local_weight: torch.Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    log_ratio_clamp: float | None = None,
) -> LossOutput:
    """w·PPO-clip(A^loc) + (1 − w)·PPO-clip(A^glob) per token (:func:`rlexp.algorithms.losses.clip.ppo_clip` for
    both terms, the same ε_low/ε_high, dual clip and log-ratio clamp). Stats: the local term's clip stats
    (``clip/*``, ``ratio/mean``) and ``copo/global_clip_frac``, the global term's clipped share."""
    if copo_global_adv is None or copo_local_weight is None:
        raise ValueError(
            "algorithm.loss=copo_clip needs batch.extras['copo_global_adv'] and ['copo_local_weight']: "
            "use the advantage estimator rlexp.algorithms.advantages.consistency_aware.copo"
        )
    kw = {"eps_low": eps_low, "eps_high": eps_high, "dual_clip": dual_clip, "log_ratio_clamp": log_ratio_clamp}
    local = ppo_clip(logp, old_logp, advantages, mask, **kw)
    glob = ppo_clip(logp, old_logp, copo_global_adv.to(logp.dtype), mask, **kw)
    w = expand_like(copo_local_weight.to(logp.dtype), logp)
    stats = dict(local.token_stats)
    stats["copo/global_clip_frac"] = glob.token_stats["clip/region_frac"]
    return LossOutput(w * local.per_token + (1.0 - w) * glob.per_token, stats)
