"""e1's Adaptive Effort Control reward — "Learning Adaptive Control of Reasoning Effort" (2025; arXiv 2510.27042).

Each completion was prompted with an effort r (``rlexp.algorithms.prompt_conditions.budgets.EffortPrompt``: r in
``batch.extras["condition"]``), a fraction of the query's current average reasoning length T_avg(x). A correct
completion keeps its reward only while ℓ ≤ r·T_avg(x): the stage appends the column ``effort_penalty`` = −1 for a
correct completion longer than that (0 otherwise), weighted by the accuracy term's weight, so the total accuracy
reward becomes 1[correct]·1[ℓ ≤ r·T_avg(x)]. T_avg(x) is the mean length of the query's completions at this step,
over all its efforts (the current policy's average: as the policy shortens, so does the target — self-adaptive).
"""

from __future__ import annotations

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import CONDITION
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_stats


@GROUP_STAGES.register
class EffortReward:
    """Group stage: correct completions over their effort's share of the query's average length lose their reward.

    Metrics: ``e1/within_effort_frac`` (completions within r·T_avg), ``e1/target_length_mean`` (r·T_avg),
    ``e1/penalised_frac`` (correct completions that lost their reward)."""

    needs_reference = False

    def __init__(self, accuracy_term: str = "accuracy", correct_min: float = 1.0, name: str = "effort_penalty"):
        self.accuracy_term, self.correct_min, self.name = accuracy_term, float(correct_min), name

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        if self.accuracy_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: EffortReward.accuracy_term={self.accuracy_term!r} is not a reward term "
                f"(terms: {batch.reward_names})"
            )
        effort = batch.extras.get(CONDITION)
        if effort is None:
            raise ValueError("EffortReward needs each row's effort: algorithm.prompt_condition=EffortPrompt")
        lengths = batch.lengths.float()
        effort = effort.to(lengths.device).float()
        average, _, _ = group_stats(lengths, batch.group_ids.to(lengths.device))
        target = effort * average
        within = lengths <= target
        correct = batch.term(self.accuracy_term).to(lengths.device) >= self.correct_min
        penalised = correct & ~within
        weight = float(batch.reward_weights[batch.reward_names.index(self.accuracy_term)])
        append_reward_column(batch, self.name, -penalised.float(), weight)
        batch.stats["e1/within_effort_frac"] = float(within.float().mean())
        batch.stats["e1/target_length_mean"] = float(target.mean())
        batch.stats["e1/penalised_frac"] = float(penalised.float().mean())
        return batch
