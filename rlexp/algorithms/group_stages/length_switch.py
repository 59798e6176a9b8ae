"""GRPO-λ's per-group reward switch ("Stable Reinforcement Learning for Efficient Reasoning", Dai, Liu, Si,
2025, arXiv 2505.18086), as a group stage.

What the paper does. The abstract: the correctness ratio among the G completions of each query decides the
reward of that group; a low ratio switches the group to length-agnostic 0/1 correctness rewards, a high
ratio keeps a length penalty. The method section, as restated (in Chinese, with its equations) in
jianzhnie/llmtech ``docs/rlhf/paper/GRPO-lambda.md`` (@6249424; the paper's own text was not readable
here, and two independent summaries, alphaXiv's and sciencestack's, describe the same "batch-wise top-λ
selection"):

1. *Batch-wise top-λ selection*: the correctness ratio of every query group of the batch is computed and
   the groups are ranked by it; the top λ share of them (the example given: the top 20 %) get
   efficiency-first optimisation, the rest accuracy-first.
2. *Efficiency-first* groups: r = 1 − α·σ((L − mean(L)_correct) / std(L)_correct) for a correct completion
   (mean and std over the lengths of the group's correct completions; σ the logistic function), 0 for a
   wrong one. *Accuracy-first* groups: the 0/1 correctness reward.
3. Then GRPO: group mean/std advantages.

Here: the stage appends a reward column ``name`` whose raw score is −σ(z) for correct completions of the
selected groups and 0 elsewhere, with weight α (``weight``), so accuracy + α·column is the reward above
(``penalty=sigmoid``). Our choices, none stated in the text we could read: λ = 0.2 (the text's example),
⌈λ · n_groups⌉ groups (at least one; as the restatement's accompanying code does), ties ranked by group order,
α = 0.6 (that code's default), the population std of the correct lengths and z = 0 where it is 0 (one
correct completion, or equal lengths), lengths in tokens with EOS.

The previous default of this stage is kept as a setting: ``penalty=kimi`` adds Kimi k1.5's length reward
(``rlexp.rewards.length.kimi_length_reward``, the ``reward=length_penalty`` term) and ``threshold=0.5
top_fraction=null`` keeps it for every group whose correctness ratio is ≥ 0.5 instead of the top-λ groups.
``threshold`` and ``top_fraction`` combine (both must hold); ``top_fraction=1`` gives the always-on penalty.
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_index, group_sum
from rlexp.rewards.length import kimi_length_reward

PENALTIES = ("sigmoid", "kimi")


def penalised_groups(ratios: torch.Tensor, threshold: float, top_fraction: float | None = None) -> torch.Tensor:
    """(n_groups,) bool: which groups get the length penalty, given their correctness ratios: the ratio is ≥
    ``threshold`` and, with ``top_fraction`` = λ, the group is among the ⌈λ · n_groups⌉ (at least one when
    λ > 0) of highest ratio (ties: earlier group first)."""
    keep = ratios >= threshold
    if top_fraction is not None:
        k = min(max(math.ceil(top_fraction * ratios.numel() - 1e-9), 1), ratios.numel()) if top_fraction > 0 else 0
        top = torch.zeros_like(keep)
        order = torch.sort(ratios, descending=True, stable=True).indices
        top[order[:k]] = True
        keep = keep & top
    return keep


def sigmoid_length_score(lengths: torch.Tensor, correct: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(N,) σ((L − mean_c) / std_c) for correct rows, 0 for the others; mean_c and std_c (population) over the
    lengths of the correct rows of the row's group; z = 0 where std_c = 0."""
    lengths, c = lengths.float(), correct.bool()
    inv, k = group_index(group_ids)
    cf = c.float()
    n = group_sum(cf, inv, k)
    mean = group_sum(lengths * cf, inv, k) / n.clamp(min=1)
    var = group_sum((lengths - mean[inv]) ** 2 * cf, inv, k) / n.clamp(min=1)
    std = var.sqrt()[inv]
    z = torch.where(std > 0, (lengths - mean[inv]) / std.clamp(min=1e-12), torch.zeros_like(lengths))
    return torch.where(c, torch.sigmoid(z), torch.zeros_like(lengths))


@GROUP_STAGES.register
class LambdaSwitch:
    """Group stage: the GRPO-λ switch between a length-penalised and a 0/1 reward per group (see module doc).

    Metrics (``batch.stats``):
      ``grpo_lambda/switched_group_frac``  share of groups on the 0/1 reward (no penalty);
      ``grpo_lambda/correct_ratio_mean``   mean correctness ratio of the groups;
      ``grpo_lambda/correct_length_mean``  mean length (tokens) of the correct completions
                                           (NaN, logged as null, when there is none);
      ``grpo_lambda/penalty_mean``         mean applied raw penalty score over all completions (before ``weight``).
    """

    needs_reference = False

    def __init__(
        self,
        accuracy_term: str = "accuracy",
        correct_min: float = 1.0,
        threshold: float = 0.0,
        top_fraction: float | None = 0.2,
        weight: float = 0.6,
        name: str = "length_penalty",
        penalty: str = "sigmoid",
    ):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"algorithm.group_stages: LambdaSwitch.threshold={threshold} must be in [0, 1]")
        if top_fraction is not None and not 0.0 <= top_fraction <= 1.0:
            raise ValueError(
                f"algorithm.group_stages: LambdaSwitch.top_fraction={top_fraction} must be in [0, 1] or null"
            )
        if weight < 0:
            raise ValueError(f"algorithm.group_stages: LambdaSwitch.weight={weight} must be >= 0")
        if penalty not in PENALTIES:
            raise ValueError(
                f"algorithm.group_stages: LambdaSwitch.penalty={penalty!r} is not one of {list(PENALTIES)}"
            )
        self.accuracy_term, self.correct_min = accuracy_term, float(correct_min)
        self.threshold, self.top_fraction, self.weight, self.name = float(threshold), top_fraction, float(weight), name
        self.penalty = penalty

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
        if self.penalty == "sigmoid":
            score = -sigmoid_length_score(lengths, correct, batch.group_ids)
        else:
            score = kimi_length_reward(lengths, correct, batch.group_ids)
        applied = torch.where(keep[inv], score, torch.zeros_like(score))
        append_reward_column(batch, self.name, applied, self.weight)
        batch.extras["lambda_penalised"] = keep[inv]
        s = batch.stats
        s["grpo_lambda/switched_group_frac"] = float((~keep).float().mean()) if k else 0.0
        s["grpo_lambda/correct_ratio_mean"] = float(ratios.mean()) if k else 0.0
        s["grpo_lambda/correct_length_mean"] = float(lengths[correct].mean()) if correct.any() else math.nan
        s["grpo_lambda/penalty_mean"] = float(applied.mean()) if len(applied) else 0.0
        return batch
