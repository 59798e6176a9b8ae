"""Self-knowledge rewards: the model judges whether it could solve a task — ``feasible`` or ``infeasible`` — and the
judgments of a group reward each other. KnowRL ("KnowRL: Teaching Language Models to Know What They Know", Kale and
Dhami, 2025; arXiv 2510.11407): k = 8 self-assessments of each task; "stability of self-knowledge assessment is
reinforced through internal agreement", with no external label.

``parse_feasibility`` reads a completion's judgment: the stated answer in the prompt's format (``#### infeasible``)
when there is one — ``feasible``, or ``infeasible`` / ``unfeasible`` / ``not feasible`` / ``isn't feasible``, any case;
a stated answer with both or neither is no judgment — else, with ``fallback_last_judgment``, the last such word of
the text.

``consensus`` is a group's consensus judgment: the one stated most often. Two judgments only, so a tie is no
consensus (``MajorityVote``'s first-seen tie-break would pick a side at random); a completion without a judgment
does not vote.

``FeasibilityConsensus`` (the trained term): 1 for a completion whose judgment is its group's consensus, else 0 —
TTRL's majority reward (``rlexp.rewards.label_free.MajorityVote``) over judgments instead of answers, as the
SeRL-based release trains on. ``JudgmentAccuracy`` (weight 0; for the log): the judgment against the record's hidden
label (``metadata.feasibility``, from ``view=self_knowledge``), missing where a record has none.
"""

from __future__ import annotations

import re

from rlexp.core.registry import REWARDS
from rlexp.data.self_knowledge import FEASIBLE, INFEASIBLE, LABELS
from rlexp.rewards.answers import extract_answer
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

_JUDGMENT = re.compile(r"(?:\bnot\s+|n't\s+)feasible\b|\b(?:in|un)?feasible\b", re.I)


def _label(word: str) -> str:
    return FEASIBLE if word.lower() == FEASIBLE else INFEASIBLE


def parse_feasibility(text: str, answer_format: str = "hash", fallback_last_judgment: bool = True) -> str | None:
    """``"feasible"``, ``"infeasible"`` or None (no judgment); see the module docstring."""
    stated = extract_answer(text, answer_format, fallback_last_number=False)
    if stated is not None:
        found = {_label(w) for w in _JUDGMENT.findall(stated)}
        return found.pop() if len(found) == 1 else None
    if not fallback_last_judgment:
        return None
    found = _JUDGMENT.findall(text)
    return _label(found[-1]) if found else None


def consensus(judgments: list[str | None]) -> tuple[str | None, int]:
    """The consensus judgment of a group and how many completions state the most frequent judgment: (label, count);
    (None, count) on a tie, (None, 0) without any judgment."""
    counts = {label: sum(j == label for j in judgments) for label in LABELS}
    top = max(counts.values())
    winners = [label for label in LABELS if counts[label] == top]
    return (winners[0] if top and len(winners) == 1 else None), top


def hidden_label(record: dict) -> str | None:
    """The record's hidden feasibility label (``view=self_knowledge``), None when it has none."""
    label = (record.get("metadata") or {}).get("feasibility")
    return label if label in LABELS else None


def group_rows(samples: list[Sample]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group, []).append(i)
    return groups


@REWARDS.register
class FeasibilityConsensus(RewardTerm):
    """1 for a completion whose feasible/infeasible judgment is its group's consensus, else 0 (KnowRL's consensus
    reward; see the module docstring). ``min_share``: the consensus must be stated by at least this share of the
    group's completions, else every completion scores 0 (0: any strict majority of the judgments)."""

    def __init__(
        self,
        weight: float = 1.0,
        answer_format: str = "hash",
        fallback_last_judgment: bool = True,
        min_share: float = 0.0,
    ):
        super().__init__(weight)
        if not 0.0 <= min_share <= 1.0:
            raise ValueError(f"reward term FeasibilityConsensus.min_share={min_share} must be in [0, 1]")
        self.answer_format, self.fallback, self.min_share = answer_format, fallback_last_judgment, float(min_share)

    def __call__(self, samples: list[Sample]) -> TermResult:
        judgments = [parse_feasibility(s.completion, self.answer_format, self.fallback) for s in samples]
        scores = [0.0] * len(samples)
        for rows in group_rows(samples).values():
            label, count = consensus([judgments[i] for i in rows])
            if label is None or count < self.min_share * len(rows):
                continue
            for i in rows:
                scores[i] = float(judgments[i] == label)
        return TermResult(scores, [False] * len(samples))


@REWARDS.register
class JudgmentAccuracy(RewardTerm):
    """1 when a completion's feasible/infeasible judgment is the record's hidden label, else 0; missing (scored 0,
    "does not apply") for a record without one. For the log (weight 0): KnowRL never trains on the label."""

    def __init__(self, weight: float = 0.0, answer_format: str = "hash", fallback_last_judgment: bool = True):
        super().__init__(weight)
        self.answer_format, self.fallback = answer_format, fallback_last_judgment

    def __call__(self, samples: list[Sample]) -> TermResult:
        scores, missing = [], []
        for s in samples:
            label = hidden_label(s.record)
            judged = parse_feasibility(s.completion, self.answer_format, self.fallback)
            scores.append(float(label is not None and judged == label))
            missing.append(label is None)
        return TermResult(scores, [False] * len(samples), missing)
