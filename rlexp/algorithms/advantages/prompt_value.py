"""Advantages against a per-prompt value anchor (SPO's tracker, PVPO's reference anchor), written by a group stage
(``rlexp.algorithms.group_stages.prompt_values``) into ``batch.extras[key]``."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES

NORMALISE = ("none", "batch")


@ADVANTAGES.register
def anchored(
    batch: RolloutBatch, key: str = "prompt_value", normalise: str = "none", eps: float = 1e-8
) -> torch.Tensor:
    """A = r − v(x), v from ``batch.extras[key]``. ``normalise=batch``: then (A − mean A)/(std A + ε) over the whole
    batch (Bessel std; SPO's global normalisation, not per group); a one-row batch gets A − mean = 0."""
    if normalise not in NORMALISE:
        raise ValueError(f"algorithm.advantage.normalise={normalise!r} is not one of {list(NORMALISE)}")
    if key not in batch.extras:
        raise KeyError(
            f"advantage anchored needs batch.extras[{key!r}]: add a stage of rlexp.algorithms.group_stages."
            "prompt_values (SingleStreamValues, ReferenceAnchor) to algorithm.group_stages"
        )
    adv = batch.reward.float() - batch.extras[key].float().to(batch.reward.device)
    if normalise == "batch":
        if adv.numel() < 2:
            return adv - adv.mean()
        adv = (adv - adv.mean()) / (adv.std() + eps)
    return adv
