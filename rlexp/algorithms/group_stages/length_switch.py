"""GRPO-λ's per-group reward switch ("Stable Reinforcement Learning for Efficient Reasoning", 2025),
as a group stage.

The paper (abstract): the correctness ratio among the G completions of each query decides the
reward of that group. A low ratio switches the group to length-agnostic 0/1 correctness rewards
(reasoning capability first); a high ratio keeps a length penalty that favours shorter correct
completions (efficiency). No released code was found, and the threshold and the penalty formula
are not in the abstract; so here:

* the penalty is Kimi k1.5's length reward (the one the paper names as the unstable baseline),
  ``rlexp.rewards.length.kimi_length_reward``, added with ``weight`` — the same function as the
  ``reward=length_penalty`` term, so the two are directly comparable;
* a group keeps the penalty when its correctness ratio (share of completions whose accuracy is
  ≥ ``correct_min``) is ≥ ``threshold`` (our choice: 0.5); below it, the penalty is zero for the
  whole group, leaving its 0/1 correctness (plus whatever other reward terms are configured);
* ``top_fraction`` (optional): additionally keep the penalty only for the ⌊top_fraction · n_groups⌋
  groups of the step with the highest correctness ratios (ties: earlier group first). A third-party
  summary of the paper describes a batch-wise "top-λ selection" of groups; this reproduces that
  reading, not verified against the paper's text. ``threshold=0`` with ``top_fraction`` set gives
  the pure top-fraction rule; ``threshold=0`` alone gives the always-on length penalty.

The applied penalty is appended as a reward column (``name``) and summed into ``batch.reward``.
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.length import kimi_length_reward


def penalised_groups(ratios: torch.Tensor, threshold: float, top_fraction: float | None = None) -> torch.Tensor:
    """(n_groups,) bool: which groups keep the length penalty, given their correctness ratios."""
    keep = ratios >= threshold
    if top_fraction is not None:
        k = math.floor(top_fraction * ratios.numel() + 1e-9)
        top = torch.zeros_like(keep)
        order = torch.sort(ratios, descending=True, stable=True).indices
        top[order[:k]] = True
        keep = keep & top
    return keep


@GROUP_STAGES.register
class LambdaSwitch:
    """Group stage: the GRPO-λ switch between a length-penalised and a 0/1 reward per group.

    Metrics (``batch.stats``):
      ``grpo_lambda/switched_group_frac``  share of groups switched to the 0/1 reward (no penalty);
      ``grpo_lambda/correct_ratio_mean``   mean correctness ratio of the groups;
      ``grpo_lambda/correct_length_mean``  mean length (tokens) of the correct completions
                                           (NaN, logged as null, when there is none);
      ``grpo_lambda/penalty_mean``         mean applied length reward over all completions.
    """

    needs_reference = False

    def __init__(
        self,
        accuracy_term: str = "accuracy",
        correct_min: float = 1.0,
        threshold: float = 0.5,
        top_fraction: float | None = None,
        weight: float = 1.0,
        name: str = "length_penalty",
    ):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"algorithm.group_stages: LambdaSwitch.threshold={threshold} must be in [0, 1]")
        if top_fraction is not None and not 0.0 <= top_fraction <= 1.0:
            raise ValueError(
                f"algorithm.group_stages: LambdaSwitch.top_fraction={top_fraction} must be in [0, 1] or null"
            )
        if weight < 0:
            raise ValueError(f"algorithm.group_stages: LambdaSwitch.weight={weight} must be >= 0")
        self.accuracy_term, self.correct_min = accuracy_term, float(correct_min)
        self.threshold, self.top_fraction, self.weight, self.name = float(threshold), top_fraction, float(weight), name

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        if self.accuracy_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: LambdaSwitch.accuracy_term={self.accuracy_term!r} "
                f"is not a reward term (terms: {batch.reward_names})"
            )
        if self.name in batch.reward_names:
            raise ValueError(
                f"algorithm.group_stages: LambdaSwitch.name={self.name!r} is already a reward term "
                f"({batch.reward_names}); GRPO-λ adds the length penalty itself: use a reward config "
                "without it (e.g. reward=accuracy_format)"
            )
        correct = batch.term(self.accuracy_term) >= self.correct_min
        lengths = batch.lengths.float()
        _, inv = torch.unique(batch.group_ids, return_inverse=True)
        k = int(inv.max()) + 1 if inv.numel() else 0
        count = torch.zeros(k, device=lengths.device).index_add_(0, inv, torch.ones_like(lengths))
        ratios = torch.zeros(k, device=lengths.device).index_add_(0, inv, correct.float().to(lengths.device)) / count
        keep = penalised_groups(ratios, self.threshold, self.top_fraction)
        penalty = kimi_length_reward(lengths, correct, batch.group_ids)
        applied = torch.where(keep[inv], penalty, torch.zeros_like(penalty))
        append_reward_column(batch, self.name, applied, self.weight)
        batch.extras["lambda_penalised"] = keep[inv]
        s = batch.stats
        s["grpo_lambda/switched_group_frac"] = float((~keep).float().mean()) if k else 0.0
        s["grpo_lambda/correct_ratio_mean"] = float(ratios.mean()) if k else 0.0
        s["grpo_lambda/correct_length_mean"] = float(lengths[correct].mean()) if correct.any() else math.nan
        s["grpo_lambda/penalty_mean"] = float(applied.mean()) if len(applied) else 0.0
        return batch
