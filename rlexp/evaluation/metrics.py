"""Evaluation metrics over n samples per problem.

* ``pass_at_k`` — the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
  Trained on Code", Codex paper, Fig. 3): with n samples of which c are correct,
  pass@k = 1 − C(n−c, k) / C(n, k), computed as the numerically stable product
  1 − ∏_{i=n−c+1}^{n} (1 − k/i) instead of with factorials.
* ``maj_at_k`` — majority voting over k of the n answers (self-consistency, Wang et al., 2023),
  averaged over k-subsets: exactly over all of them when there are at most ``max_subsets``, else
  over ``max_subsets`` subsets drawn with a fixed seed. Missing answers do not vote (``missing="abstain"``);
  ``missing="vote"`` (``eval.maj_missing``) counts them as one more answer, incorrect, which wins when no
  answer outnumbers it (verl's ``calc_maj_val``, where a missing prediction is a vote key like any other).
  Ties: ``tie="random"`` gives the expected correctness of a uniformly random pick among the tied answers;
  ``tie="first"`` picks the tied answer
  that appears first in the subset (verl's rule).
* ``bootstrap_ci`` — percentile bootstrap over problems for a per-problem statistic (pass@1).

Metric names are MLflow-safe (MLflow rejects ``@``): pass@k is logged as ``pass_at_k`` and maj@k as
``maj_at_k``, e.g. ``eval/gsm8k/pass_at_1``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: n samples, c correct, 1 <= k <= n."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must be in [1, n={n}]")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def resolve_ks(ks: Sequence[int] | None, n: int, key: str = "eval.ks") -> list[int]:
    """The configured k values, sorted and unique (``None``: every k from 1 to n). A k outside 1..n is an error
    naming ``key`` and ``eval.n``: pass@k of a k above n does not exist, and dropping it left a table without the
    column that was asked for."""
    if ks is None:
        return list(range(1, n + 1))
    from rlexp.config.schema import check_ks

    return sorted(set(check_ks(ks, n, key)))


MAJ_MISSING = ("abstain", "vote")


def majority_pick(
    clusters: Sequence[int | None], correct_of: dict[int, float], tie: str = "random", missing: str = "abstain"
) -> float:
    """Correctness of the majority answer among ``clusters`` (cluster id of each sample's answer,
    ``None`` for no answer). ``correct_of`` maps a cluster id to its correctness (0/1). ``missing``: a
    missing answer abstains, or (``vote``) is a vote for "no answer", correctness 0."""
    if missing not in MAJ_MISSING:
        raise ValueError(f"eval.maj_missing={missing!r} is not one of {MAJ_MISSING}")
    votes = [c for c in clusters if c is not None or missing == "vote"]
    if not votes:
        return 0.0
    correct_of = {**correct_of, None: 0.0}
    counts = Counter(votes)
    top = max(counts.values())
    tied = [c for c in counts if counts[c] == top]  # Counter keeps first-appearance order
    if tie == "first":
        return float(correct_of[tied[0]])
    if tie == "random":
        return float(sum(correct_of[c] for c in tied) / len(tied))
    raise ValueError(f"eval.maj_tie={tie!r} is not one of ('random', 'first')")


def maj_at_k(
    clusters: Sequence[int | None],
    correct_of: dict[int, float],
    k: int,
    tie: str = "random",
    max_subsets: int = 2000,
    seed: int = 0,
    missing: str = "abstain",
) -> float:
    """maj@k for one problem, averaged over k-subsets of its n samples (see module docstring)."""
    n = len(clusters)
    if not 1 <= k <= n:
        raise ValueError(f"maj_at_k: k={k} must be in [1, n={n}]")
    if math.comb(n, k) <= max_subsets:
        subsets = itertools.combinations(range(n), k)
    else:
        rng = random.Random(seed)
        subsets = (rng.sample(range(n), k) for _ in range(max_subsets))
    total, count = 0.0, 0
    for idx in subsets:
        total += majority_pick([clusters[i] for i in idx], correct_of, tie, missing)
        count += 1
    return total / count


def cluster_answers(answers: Sequence[str | None], equivalent) -> list[int | None]:
    """Cluster id per answer: answers that ``equivalent(a, b)`` joins share an id (the index of the
    cluster's first member); ``None`` stays ``None``."""
    reps: list[tuple[int, str]] = []
    out: list[int | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        for cid, rep in reps:
            if a == rep or equivalent(a, rep):
                out.append(cid)
                break
        else:
            reps.append((len(reps), a))
            out.append(len(reps) - 1)
    return out


def bootstrap_ci(
    values: Sequence[float], num_resamples: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of ``values`` (one per problem)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    if not 0 < level < 1:
        raise ValueError(f"eval.ci_level={level} must be in (0, 1)")
    if num_resamples <= 0:
        return float(x.mean()), float(x.mean())
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(num_resamples, x.size))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def summarize(
    correct: Sequence[Sequence[float]],
    clusters: Sequence[Sequence[int | None]] | None = None,
    correct_of: Sequence[dict[int, float]] | None = None,
    lengths: Sequence[Sequence[int]] = (),
    truncated: Sequence[Sequence[bool]] = (),
    ks: Sequence[int] | None = None,
    maj_ks: Sequence[int] | None = None,
    maj_tie: str = "random",
    max_subsets: int = 2000,
    num_resamples: int = 1000,
    ci_level: float = 0.95,
    seed: int = 0,
    maj_missing: str = "abstain",
) -> dict[str, float]:
    """Benchmark-level metrics from per-problem, per-sample results (all problems have n samples).

    ``correct[p][j]`` is 1/0 for sample j of problem p. Returns ``pass_at_k`` for each k in ``ks``
    (``None``: 1..n), ``maj_at_k`` for each k in ``maj_ks`` (``None``: n; only with ``clusters``),
    ``accuracy`` (mean over all samples = pass@1), its bootstrap CI, length mean/median and the
    truncated share."""
    if not correct:
        raise ValueError("summarize: no problems")
    n = len(correct[0])
    if n == 0 or any(len(row) != n for row in correct):
        raise ValueError(f"summarize: every problem needs the same number of samples (first has {n})")
    m: dict[str, float] = {"problems": float(len(correct)), "samples_per_problem": float(n)}
    c = [int(round(sum(row))) for row in correct]
    for k in resolve_ks(ks, n):
        m[f"pass_at_{k}"] = float(np.mean([pass_at_k(n, ci, k) for ci in c]))
    per_problem = [sum(row) / n for row in correct]
    m["accuracy"] = float(np.mean(per_problem))
    m["pass_at_1_ci_low"], m["pass_at_1_ci_high"] = bootstrap_ci(per_problem, num_resamples, ci_level, seed)
    if clusters is not None and correct_of is not None:
        for k in resolve_ks(maj_ks if maj_ks is not None else [n], n, "eval.maj_ks"):
            m[f"maj_at_{k}"] = float(
                np.mean(
                    [
                        maj_at_k(cl, co, k, maj_tie, max_subsets, seed, maj_missing)
                        for cl, co in zip(clusters, correct_of)
                    ]
                )
            )
    flat_len = [x for row in lengths for x in row]
    if flat_len:
        m["length/mean"] = float(np.mean(flat_len))
        m["length/median"] = float(np.median(flat_len))
    flat_tr = [bool(x) for row in truncated for x in row]
    if flat_tr:
        m["length/truncated_frac"] = float(np.mean(flat_tr))
    return m
