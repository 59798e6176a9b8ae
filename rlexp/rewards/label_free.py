"""Label-free rewards: the policy's own agreement stands in for the ground truth.

``MajorityVote`` — TTRL ("TTRL: Test-Time Reinforcement Learning", Zuo et al., 2025; arXiv 2504.16084): the answers
of a prompt's G completions vote, the most frequent one is the pseudo-label, and each completion scores 1 when its
answer equals it (math-equivalence, as the accuracy check), else 0. The ground truth is never read (the accuracy
term can still be logged beside it, at weight 0, to watch the label-free run). SPINE trains with this reward.
"""

from __future__ import annotations

from rlexp.core.registry import REWARDS
from rlexp.rewards.answers import extract_answer, math_equal
from rlexp.rewards.terms import RewardTerm, Sample, TermResult


def majority_answer(answers: list[str | None]) -> str | None:
    """The most frequent answer, answers compared by math-equivalence; ties go to the one seen first; None when no
    completion stated an answer."""
    clusters: list[tuple[str, int]] = []
    for a in answers:
        if a is None:
            continue
        for i, (rep, n) in enumerate(clusters):
            if a == rep or math_equal(a, rep):
                clusters[i] = (rep, n + 1)
                break
        else:
            clusters.append((a, 1))
    if not clusters:
        return None
    best = max(n for _, n in clusters)
    return next(rep for rep, n in clusters if n == best)


def _same(answer: str | None, label: str) -> bool:
    return answer is not None and (answer == label or math_equal(answer, label))


@REWARDS.register
class MajorityVote(RewardTerm):
    """1 for a completion whose answer is its group's majority answer, else 0 (TTRL; see the module doc).
    ``min_share``: the majority must hold at least this share of the group's completions, else every completion
    scores 0 (no pseudo-label; 0: any plurality counts)."""

    def __init__(
        self,
        weight: float = 1.0,
        answer_format: str = "hash",
        fallback_last_number: bool = True,
        min_share: float = 0.0,
    ):
        super().__init__(weight)
        if not 0.0 <= min_share <= 1.0:
            raise ValueError(f"reward term MajorityVote.min_share={min_share} must be in [0, 1]")
        self.answer_format, self.fallback, self.min_share = answer_format, fallback_last_number, float(min_share)

    def __call__(self, samples: list[Sample]) -> TermResult:
        answers = [extract_answer(s.completion, self.answer_format, self.fallback) for s in samples]
        groups: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(s.group, []).append(i)
        scores = [0.0] * len(samples)
        for rows in groups.values():
            label = majority_answer([answers[i] for i in rows])
            if label is None:
                continue
            agree = [
                i for i in rows if answers[i] is not None and (answers[i] == label or math_equal(answers[i], label))
            ]
            if len(agree) < self.min_share * len(rows):
                continue
            for i in agree:
                scores[i] = 1.0
        return TermResult(scores, [False] * len(samples))
