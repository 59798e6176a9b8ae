"""What a self-knowledge run decides (KnowRL, arXiv 2510.11407; the reward is ``reward=self_knowledge``,
``rlexp.rewards.self_knowledge``).

``FeasibilityVotes`` reads every completion's feasible/infeasible judgment (``parse_feasibility``, the prompt's answer
format) and logs, per step:

* ``self_knowledge/consensus_share_mean`` — over the groups with a judgment, the share of the group's completions
  that state its most frequent judgment (the internal agreement the reward reinforces; 1: unanimous);
* ``self_knowledge/no_consensus_frac`` — groups without a consensus (a tie, or no judgment at all);
* ``self_knowledge/judged_frac`` and ``self_knowledge/feasible_frac`` — completions that state a judgment, and the
  share of those judgments that say feasible;
* for the log only, never for training — against the record's hidden label (``view=self_knowledge``; rows without
  one are left out): ``self_knowledge/judgment_accuracy`` (a completion without a judgment counts as wrong),
  ``self_knowledge/judgment_f1`` (F1 with infeasible the positive class, as unanswerable-question detection is
  scored), ``self_knowledge/consensus_accuracy`` (the groups' consensus judgments). NaN where nothing is counted.

The batch is returned unchanged."""

from __future__ import annotations

import math

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.self_knowledge import FEASIBLE, INFEASIBLE, consensus, hidden_label, parse_feasibility


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def judgment_f1(judgments: list[str | None], labels: list[str]) -> float:
    """F1 of the judgments against ``labels`` with ``infeasible`` the positive class (a missing judgment is not a
    positive); NaN when neither a judgment nor a label is infeasible."""
    tp = sum(j == INFEASIBLE and y == INFEASIBLE for j, y in zip(judgments, labels))
    fp = sum(j == INFEASIBLE and y != INFEASIBLE for j, y in zip(judgments, labels))
    fn = sum(j != INFEASIBLE and y == INFEASIBLE for j, y in zip(judgments, labels))
    return 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else math.nan


@GROUP_STAGES.register
class FeasibilityVotes:
    """Group stage: logs the feasible/infeasible judgments of each group (see the module docstring).
    ``require_term``: a reward term the run must have (the consensus term of reward=self_knowledge; a label-free
    method refuses to train on something else by mistake)."""

    needs_reference = False

    def __init__(self, fallback_last_judgment: bool = True, require_term: str | None = "consensus"):
        self.fallback, self.require_term = fallback_last_judgment, require_term

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if self.require_term is not None and self.require_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: FeasibilityVotes.require_term={self.require_term!r} is not a reward term "
                f"(terms: {batch.reward_names}): KnowRL trains on its consensus reward, reward=self_knowledge"
            )
        fmt = getattr(ctx, "answer_format", "hash")
        judgments = [parse_feasibility(c, fmt, self.fallback) for c in batch.completions]
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            groups.setdefault(g, []).append(i)
        shares, no_consensus, consensus_right = [], 0, []
        for rows in groups.values():
            label, count = consensus([judgments[i] for i in rows])
            if count:
                shares.append(count / len(rows))
            if label is None:
                no_consensus += 1
                continue
            hidden = hidden_label(batch.records[rows[0]])
            if hidden is not None:
                consensus_right.append(float(label == hidden))
        stated = [j for j in judgments if j is not None]
        labelled = [(j, hidden_label(r)) for j, r in zip(judgments, batch.records) if hidden_label(r) is not None]
        s = batch.stats
        s["self_knowledge/consensus_share_mean"] = _mean(shares)
        s["self_knowledge/no_consensus_frac"] = no_consensus / max(len(groups), 1)
        s["self_knowledge/judged_frac"] = len(stated) / max(len(judgments), 1)
        s["self_knowledge/feasible_frac"] = _mean([float(j == FEASIBLE) for j in stated])
        s["self_knowledge/judgment_accuracy"] = _mean([float(j == y) for j, y in labelled])
        s["self_knowledge/judgment_f1"] = judgment_f1([j for j, _ in labelled], [y for _, y in labelled])
        s["self_knowledge/consensus_accuracy"] = _mean(consensus_right)
        return batch
