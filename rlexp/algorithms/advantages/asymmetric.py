"""APO — "APO: Enhancing Reasoning Ability of MLLMs via Asymmetric Policy Optimization" (2025; arXiv 2506.21655;
released code Indolent-Kawhi/View-R1, ``openrlhf/trainer/ray/ppo_actor.py`` and ``ppo_utils/experience_maker.py``):
GRPO's advantage treated asymmetrically for positive and negative samples.

* DADS (difficulty-adaptive divergence shaping), on the positives: with the prompt's difficulty d = 1 − (correct
  completions / G), a completion with A > 0 weighs its KL to the reference by 1 − exp(−k·(1 − d)) (easy prompts keep
  the policy close, hard ones let it move); d = 0 or 1, and every A ≤ 0 completion, weigh 1. Set as per-row weights
  of the KL term (``batch.extras["kl_row_weights"]``).
* STCR (suboptimal trajectory complexity regularisation), on the negatives: a wrong completion longer than the
  group's correct ones on average (Δ = L − mean L_correct > 0) has its advantage multiplied by 1 + (1 − b^(−Δ)),
  b = 1.00001 — long wrong answers are pushed down harder; groups without a correct completion are left as they are.
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import KL_ROW_WEIGHTS
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_index, group_sum


@ADVANTAGES.register
def apo(
    batch: RolloutBatch,
    metric: str = "accuracy",
    correct_min: float = 1.0,
    k: float = math.e,
    length_base: float = 1.00001,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(N,) GRPO advantages with STCR's length weight on long wrong completions; DADS's KL weights in extras."""
    if metric not in batch.reward_names:
        raise KeyError(f"algorithm.advantage.metric={metric!r} is not a reward term (terms: {batch.reward_names})")
    if length_base <= 1.0:
        raise ValueError(f"algorithm.advantage.length_base={length_base} must be > 1")
    adv = normalize_rewards(batch.reward, batch.group_ids, scale="group", eps=eps)
    correct = (batch.term(metric).float() >= correct_min).to(adv.device)
    lengths = batch.lengths.float().to(adv.device)
    inv, n_groups = group_index(batch.group_ids.to(adv.device))
    size = group_sum(torch.ones_like(adv), inv, n_groups)
    n_correct = group_sum(correct.float(), inv, n_groups)
    difficulty = (1.0 - n_correct / size)[inv]
    mean_correct = (group_sum(lengths * correct, inv, n_groups) / n_correct.clamp(min=1))[inv]
    delta = lengths - mean_correct
    has_correct = n_correct[inv] > 0
    long_wrong = (~correct.bool()) & has_correct & (delta > 0)
    length_weight = torch.where(long_wrong, 2.0 - torch.pow(torch.tensor(length_base), -delta), torch.ones_like(adv))
    interior = (difficulty > 0) & (difficulty < 1)
    kl_weight = torch.where((adv > 0) & interior, 1.0 - torch.exp(-k * (1.0 - difficulty)), torch.ones_like(adv))
    batch.extras[KL_ROW_WEIGHTS] = kl_weight
    batch.stats["apo/kl_weight_mean"] = float(kl_weight.mean())
    batch.stats["apo/length_weight_max"] = float(length_weight.max()) if len(length_weight) else 1.0
    return adv * length_weight


apo.kl_row_weights = True  # sets batch.extras["kl_row_weights"] (Algorithm.token_loss_extras)
