"""Answer votes of each group, for label-free methods (RESTRAIN, TTRL-style pseudo-labels).

``AnswerVotes`` extracts each completion's answer in the prompt's format, clusters a group's answers by
math-equivalence (``rlexp.rewards.label_free``) and writes per row the cluster it belongs to
(``batch.extras["answer_cluster"]``: 0..k−1 within its group, −1 without an answer) and that cluster's share of the
group (``batch.extras["answer_share"]``). It logs what a label-free run decides: the majority's share of its group
(``votes/majority_share_mean``), the groups with no answer at all (``votes/no_answer_group_frac``) and — read only
for the log, never for training — how often the majority answer is the hidden label (``votes/pseudo_label_accuracy``,
over the groups with a majority and a checkable label)."""

from __future__ import annotations

import contextlib
import math

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import ANSWER_CLUSTER, ANSWER_SHARE
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.answers import extract_answer, math_equal
from rlexp.rewards.terms import check_answer


def cluster_answers(answers: list[str | None]) -> list[int]:
    """Cluster ids (first-seen order) of ``answers`` by equality or math-equivalence; −1 for a missing answer."""
    reps: list[str] = []
    out = []
    for a in answers:
        if a is None:
            out.append(-1)
            continue
        for j, rep in enumerate(reps):
            if a == rep or math_equal(a, rep):
                out.append(j)
                break
        else:
            reps.append(a)
            out.append(len(reps) - 1)
    return out


@GROUP_STAGES.register
class AnswerVotes:
    """Group stage: each row's answer cluster and its share of the group (see the module docstring). ``require_term``:
    a reward term the run must have (a label-free method refuses to train on the ground-truth reward by mistake)."""

    needs_reference = False

    def __init__(self, fallback_last_number: bool = True, require_term: str | None = None):
        self.fallback, self.require_term = fallback_last_number, require_term

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if self.require_term is not None and self.require_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: AnswerVotes.require_term={self.require_term!r} is not a reward term (terms: "
                f"{batch.reward_names}): a label-free method trains on its vote reward, e.g. reward=majority_vote"
            )
        fmt = getattr(ctx, "answer_format", "hash")
        answers = [extract_answer(c, fmt, fallback_last_number=self.fallback) for c in batch.completions]
        cluster = torch.full((len(batch),), -1, dtype=torch.long)
        share = torch.zeros(len(batch))
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            groups.setdefault(g, []).append(i)
        majority_shares, correct_majorities, empty = [], [], 0
        for rows in groups.values():
            ids = cluster_answers([answers[i] for i in rows])
            counts: dict[int, int] = {}
            for j in ids:
                if j >= 0:
                    counts[j] = counts.get(j, 0) + 1
            for i, j in zip(rows, ids):
                cluster[i] = j
                share[i] = counts[j] / len(rows) if j >= 0 else 0.0
            if not counts:
                empty += 1
                continue
            top = max(counts, key=lambda j: (counts[j], -j))  # ties: the first seen
            majority_shares.append(counts[top] / len(rows))
            row = rows[ids.index(top)]
            record = batch.records[row]
            if record.get("answer") is not None:
                with contextlib.suppress(KeyError, ValueError):  # a label its scorer cannot check: left out of the log
                    correct_majorities.append(check_answer(answers[row], record))
        batch.extras[ANSWER_CLUSTER] = cluster
        batch.extras[ANSWER_SHARE] = share
        s = batch.stats
        s["votes/majority_share_mean"] = sum(majority_shares) / len(majority_shares) if majority_shares else math.nan
        s["votes/no_answer_group_frac"] = empty / max(len(groups), 1)
        s["votes/pseudo_label_accuracy"] = (
            sum(correct_majorities) / len(correct_majorities) if correct_majorities else math.nan
        )
        return batch
