"""Preference pairs from scored groups of completions (pure: no model, no torch).

A group is the completions of one prompt, each with its total reward and its length in tokens. Two completions
compare as

* the higher reward wins ("correct beats incorrect");
* at equal reward (within ``eps``) and ``prefer_shorter``, the shorter wins ("shorter beats longer"), when that
  reward is at least ``shorter_min_reward`` (null: at any reward; set it to the correct answer's reward to
  prefer the shorter only among correct completions);
* otherwise it is a tie: the pair is dropped.

Identical completion texts are one answer: a group whose completions are all the same text (one distinct answer)
gives no pair, whatever its size. Odd group sizes need nothing special.

Modes: ``all`` (every decisive pair of the group's distinct answers), ``sampled`` (``pairs_per_group`` of those,
drawn without replacement with a seeded generator), ``best_worst`` (the best against the worst by the same order;
none when they tie).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MODES = ("all", "sampled", "best_worst")


@dataclass(frozen=True)
class Candidate:
    text: str
    reward: float
    length: int


@dataclass(frozen=True)
class Pair:
    group: int
    chosen: int  # index of the winner within its group
    rejected: int


@dataclass
class PairStats:
    groups: int = 0
    pairs: int = 0
    tied_pairs: int = 0  # candidate pairs dropped as ties (all / sampled: among the distinct answers)
    duplicate_completions: int = 0  # completions whose text an earlier one of the group already had
    single_answer_groups: int = 0  # groups with one distinct answer: no pair
    no_pair_groups: int = 0  # groups that gave no pair (single answer or all ties)
    extra: dict = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        return {
            "pref/pairs": float(self.pairs),
            "pref/pairs_dropped_ties": float(self.tied_pairs),
            "pref/single_answer_groups": float(self.single_answer_groups),
            "pref/no_pair_groups": float(self.no_pair_groups),
        }


def compare(a: Candidate, b: Candidate, prefer_shorter: bool, shorter_min_reward: float | None, eps: float) -> int:
    """1 when ``a`` wins, -1 when ``b`` wins, 0 on a tie (see the module docstring)."""
    if a.reward > b.reward + eps:
        return 1
    if b.reward > a.reward + eps:
        return -1
    if prefer_shorter and a.length != b.length:
        if shorter_min_reward is None or min(a.reward, b.reward) >= shorter_min_reward - eps:
            return 1 if a.length < b.length else -1
    return 0


def build_pairs(
    groups: list[list[Candidate]],
    mode: str = "all",
    pairs_per_group: int = 1,
    prefer_shorter: bool = True,
    shorter_min_reward: float | None = None,
    seed: int = 0,
    eps: float = 1e-9,
) -> tuple[list[Pair], PairStats]:
    """The pairs of every group (indices into the group's list) and what was built and dropped."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {list(MODES)}")
    if mode == "sampled" and pairs_per_group < 1:
        raise ValueError(f"pairs_per_group={pairs_per_group}: must be >= 1 with mode=sampled")
    rng = random.Random(seed)
    stats = PairStats(groups=len(groups))
    pairs: list[Pair] = []
    for g, group in enumerate(groups):
        distinct, seen = [], set()
        for i, c in enumerate(group):
            if c.text in seen:
                stats.duplicate_completions += 1
                continue
            seen.add(c.text)
            distinct.append(i)
        if len(distinct) < 2:
            stats.single_answer_groups += 1
            stats.no_pair_groups += 1
            continue

        def cmp(i: int, j: int) -> int:
            return compare(group[i], group[j], prefer_shorter, shorter_min_reward, eps)

        found: list[Pair] = []
        if mode == "best_worst":
            best = worst = distinct[0]
            for i in distinct[1:]:
                if cmp(i, best) > 0:
                    best = i
                if cmp(i, worst) < 0:
                    worst = i
            if best != worst and cmp(best, worst) > 0:
                found.append(Pair(g, best, worst))
            else:
                stats.tied_pairs += 1
        else:
            decisive = []
            for a in range(len(distinct)):
                for b in range(a + 1, len(distinct)):
                    i, j = distinct[a], distinct[b]
                    c = cmp(i, j)
                    if c == 0:
                        stats.tied_pairs += 1
                    else:
                        decisive.append(Pair(g, i, j) if c > 0 else Pair(g, j, i))
            if mode == "sampled" and len(decisive) > pairs_per_group:
                decisive = rng.sample(decisive, pairs_per_group)
            found = decisive
        if not found:
            stats.no_pair_groups += 1
        pairs.extend(found)
    stats.pairs = len(pairs)
    return pairs, stats
