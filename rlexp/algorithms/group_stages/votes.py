"""Answer votes of each group, for label-free methods (RESTRAIN, TTRL-style pseudo-labels, Co-Reward's cross votes).

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

from rlexp.algorithms.group_stages.base import append_reward_column, refuse_trained_label
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import ANSWER_CLUSTER, ANSWER_SHARE, CONDITION
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


def majority_cluster(ids: list[int]) -> int | None:
    """The most frequent cluster id of ``ids`` (−1, no answer, never votes); ties go to the first seen; None when no
    row has an answer."""
    counts: dict[int, int] = {}
    for j in ids:
        if j >= 0:
            counts[j] = counts.get(j, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda j: (counts[j], -ids.index(j)))


def cross_vote_rewards(answers: list[str | None], variants: list[int]) -> tuple[list[float], dict[int, str | None]]:
    """Co-Reward's cross-referred votes within one group: each wording's pseudo-label is the majority answer of the
    completions of the *other* wordings; a completion scores 1 when its answer equals its wording's pseudo-label,
    else 0 (no label, or no answer: 0). Returns the scores and each wording's pseudo-label."""
    ids = cluster_answers(answers)
    labels: dict[int, str | None] = {}
    scores = [0.0] * len(answers)
    for v in sorted(set(variants)):
        others = [ids[i] for i in range(len(ids)) if variants[i] != v]
        top = majority_cluster(others)
        labels[v] = None if top is None else answers[ids.index(top)]
        for i in range(len(ids)):
            if variants[i] == v and top is not None and ids[i] == top:
                scores[i] = 1.0
    return scores, labels


def row_variants(batch: RolloutBatch, stage: str) -> list[int]:
    """Each row's wording (the paraphrase set's variant index, ``batch.extras["condition"]``)."""
    variants = batch.extras.get(CONDITION)
    if variants is None:
        raise ValueError(
            f"algorithm.group_stages: {stage} compares a group's wordings of the question: set "
            "algorithm.prompt_condition to rlexp.algorithms.prompt_conditions.paraphrases.ParaphraseSet"
        )
    return [int(v) for v in variants.tolist()]


@GROUP_STAGES.register
class CrossVote:
    """Group stage: Co-Reward's contrastive-agreement reward ("Co-Reward: Self-Supervised Reinforcement Learning for
    Large Language Model Reasoning via Contrastive Agreement", 2025; arXiv 2508.00410). Each group holds G/2
    completions of the question and G/2 of its rephrased analogue (``ParaphraseSet``, k=2); the majority answer of
    each wording's completions is the pseudo-label of the other's (``cross_vote_rewards``; with k > 2, of all the
    others). Appends the reward column ``name`` (weight 1). ``label_term``: a reward term that reads the ground truth
    and must stay at weight 0 (Co-Reward trains without labels; reward=label_free logs accuracy at weight 0).

    Logged: ``co_reward/label_agreement`` (groups whose wordings' majorities agree: the contrastive agreement),
    ``co_reward/no_label_frac`` (wordings without a pseudo-label), ``co_reward/pseudo_label_accuracy`` (the
    pseudo-labels against the hidden label, for the log only)."""

    needs_reference = False

    def __init__(self, name: str = "co_reward", fallback_last_number: bool = True, label_term: str | None = "accuracy"):
        self.name, self.fallback, self.label_term = name, fallback_last_number, label_term

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        refuse_trained_label(batch, self.label_term, "CrossVote")
        variants = row_variants(batch, "CrossVote")
        fmt = getattr(ctx, "answer_format", "hash")
        answers = [extract_answer(c, fmt, fallback_last_number=self.fallback) for c in batch.completions]
        scores = torch.zeros(len(batch))
        agree, no_label, wordings, correct = [], 0, 0, []
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            groups.setdefault(g, []).append(i)
        for rows in groups.values():
            row_scores, labels = cross_vote_rewards([answers[i] for i in rows], [variants[i] for i in rows])
            for i, s in zip(rows, row_scores):
                scores[i] = s
            wordings += len(labels)
            no_label += sum(label is None for label in labels.values())
            present = [label for label in labels.values() if label is not None]
            if len(present) == len(labels):
                agree.append(float(len(set(cluster_answers(present))) == 1))
            record = batch.records[rows[0]]
            if record.get("answer") is not None:
                for label in present:
                    with contextlib.suppress(KeyError, ValueError):  # a label its scorer cannot check: not logged
                        correct.append(check_answer(label, record))
        append_reward_column(batch, self.name, scores)
        s = batch.stats
        s["co_reward/label_agreement"] = sum(agree) / len(agree) if agree else math.nan
        s["co_reward/no_label_frac"] = no_label / max(wordings, 1)
        s["co_reward/pseudo_label_accuracy"] = sum(correct) / len(correct) if correct else math.nan
        return batch
