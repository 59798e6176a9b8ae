"""Diversity rewards: a completion is rewarded for differing from the other completions of its group.

``LexicalDiversity`` — the lexical-diversity reward of MultiRole-R1 ("Diversity-Enhanced Reasoning for Subjective
Questions", Wang et al., 2025; arXiv 2507.20187), which adds diversity rewards to the verifiable reward under GRPO.
The paper's own definition was not in what we could read; ours: each completion's set S_i of distinct word n-grams
(orders 1..n, lower-cased words), and

    d_i = 1 − mean_{j ≠ i in the group} |S_i ∩ S_j| / |S_i ∪ S_j|

(one minus its mean Jaccard overlap with the others): 0 when every other completion uses the same n-grams, 1 when it
shares none with any. Two empty completions count as identical (overlap 1). A group of one completion scores 0 (there
is nothing to differ from). The perspective-diversity reward (how many stakeholder roles a reasoning chain takes, which
the paper scores with its role annotations) is not carried.
"""

from __future__ import annotations

import re

from rlexp.core.registry import REWARDS
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

UNITS = ("words", "tokens")
_WORD = re.compile(r"\w+|[^\w\s]")


def ngram_set(units: list, n: int) -> set[tuple]:
    """The distinct n-grams of orders 1..n of ``units``."""
    return {tuple(units[i : i + k]) for k in range(1, n + 1) for i in range(len(units) - k + 1)}


def jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def group_diversity(sets: list[set]) -> list[float]:
    """1 − mean Jaccard overlap of each set with the others (0 for a lone set)."""
    g = len(sets)
    if g < 2:
        return [0.0] * g
    return [1.0 - sum(jaccard(sets[i], sets[j]) for j in range(g) if j != i) / (g - 1) for i in range(g)]


@REWARDS.register
class LexicalDiversity(RewardTerm):
    """1 − a completion's mean n-gram Jaccard overlap with the other completions of its group (see the module doc).
    ``n``: the largest n-gram order; ``unit``: ``words`` (lower-cased words and punctuation of the text) or
    ``tokens`` (the sampled token ids)."""

    def __init__(self, weight: float = 1.0, n: int = 2, unit: str = "words"):
        super().__init__(weight)
        if int(n) < 1:
            raise ValueError(f"reward term LexicalDiversity.n={n} must be >= 1")
        if unit not in UNITS:
            raise ValueError(f"reward term LexicalDiversity.unit={unit!r} is not one of {list(UNITS)}")
        self.n, self.unit = int(n), unit

    def units(self, sample: Sample) -> list:
        if self.unit == "tokens" and sample.completion_ids is not None:
            return list(sample.completion_ids)
        return _WORD.findall(sample.completion.lower())

    def __call__(self, samples: list[Sample]) -> TermResult:
        groups: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(s.group, []).append(i)
        scores = [0.0] * len(samples)
        for rows in groups.values():
            sets = [ngram_set(self.units(samples[i]), self.n) for i in rows]
            for i, d in zip(rows, group_diversity(sets)):
                scores[i] = d
        return TermResult(scores, [False] * len(samples))
