"""pass@k (unbiased estimator), maj@k (ties), bootstrap CI and the benchmark summary."""

import itertools
import math
import random

import pytest

from rlexp.evaluation.metrics import (
    bootstrap_ci,
    cluster_answers,
    maj_at_k,
    majority_pick,
    pass_at_k,
    resolve_ks,
    summarize,
)


def test_pass_at_k_by_hand_n5_c2():
    # 1 - C(3,k)/C(5,k): k=1: 1-3/5, k=2: 1-3/10, k=3: 1-1/10, k=4,5: C(3,k)=0 -> 1
    expected = {1: 0.4, 2: 0.7, 3: 0.9, 4: 1.0, 5: 1.0}
    for k, v in expected.items():
        assert pass_at_k(5, 2, k) == pytest.approx(v, abs=1e-12), k


def test_pass_at_k_edges():
    assert pass_at_k(8, 0, 3) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    with pytest.raises(ValueError, match="k=9"):
        pass_at_k(8, 2, 9)
    with pytest.raises(ValueError, match="c=9"):
        pass_at_k(8, 9, 1)


def test_pass_at_k_matches_brute_force_over_all_k_subsets():
    rng = random.Random(0)
    for _ in range(40):
        n = rng.randint(1, 9)
        correct = [rng.random() < 0.4 for _ in range(n)]
        c = sum(correct)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    # the factorial form overflows floats here; the product form does not
    v = pass_at_k(2000, 3, 100)
    exact = 1 - math.comb(1997, 100) / math.comb(2000, 100)
    assert v == pytest.approx(exact, rel=1e-9)


def test_resolve_ks_keeps_k_le_n():
    assert resolve_ks(None, 4) == [1, 2, 3, 4]
    assert resolve_ks([8, 1, 2, 4, 2], 8) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="eval.ks"):
        resolve_ks([0, 1], 4)
    with pytest.raises(ValueError, match=r"eval\.ks=\[1, 2, 4, 8, 16\]: k=16 is more than eval\.n=8"):
        resolve_ks([1, 2, 4, 8, 16], 8)


def test_majority_pick_with_ties():
    correct_of = {0: 1.0, 1: 0.0, 2: 0.0}
    # clear majority
    assert majority_pick([1, 1, 0], correct_of) == 0.0
    assert majority_pick([0, 0, 1], correct_of) == 1.0
    # tie between a correct and a wrong answer: expected value 1/2, or the first to appear
    assert majority_pick([1, 0, 0, 1], correct_of, "random") == 0.5
    assert majority_pick([1, 0, 0, 1], correct_of, "first") == 0.0
    assert majority_pick([0, 1, 1, 0], correct_of, "first") == 1.0
    # three-way tie, one correct
    assert majority_pick([2, 1, 0], correct_of, "random") == pytest.approx(1 / 3)
    # missing answers do not vote; all missing -> 0
    assert majority_pick([None, None, 0], correct_of) == 1.0
    assert majority_pick([None, None], correct_of) == 0.0
    with pytest.raises(ValueError, match="maj_tie"):
        majority_pick([0], correct_of, "coin")


def test_maj_at_k_averages_over_subsets():
    clusters, correct_of = [0, 0, 1], {0: 1.0, 1: 0.0}
    assert maj_at_k(clusters, correct_of, 3) == 1.0
    # k=1: mean correctness of single samples; k=2: subsets {00}->1, {01}->0.5, {01}->0.5
    assert maj_at_k(clusters, correct_of, 1) == pytest.approx(2 / 3)
    assert maj_at_k(clusters, correct_of, 2) == pytest.approx((1 + 0.5 + 0.5) / 3)
    # "first": the tied answer that comes first (by sample index) wins
    assert maj_at_k(clusters, correct_of, 2, tie="first") == 1.0
    assert maj_at_k([1, 0, 0], correct_of, 2, tie="first") == pytest.approx((0 + 0 + 1) / 3)
    # sampled subsets approach the exact average
    rng = random.Random(1)
    big = [rng.choice([0, 1, 2, None]) for _ in range(16)]
    co = {0: 1.0, 1: 0.0, 2: 0.0}
    exact = maj_at_k(big, co, 5, max_subsets=10**6)
    assert maj_at_k(big, co, 5, max_subsets=3000, seed=3) == pytest.approx(exact, abs=0.03)


def test_cluster_answers_uses_equivalence():
    eq = lambda a, b: a.replace(" ", "") == b.replace(" ", "")
    assert cluster_answers(["1/2", "1 / 2", None, "3"], eq) == [0, 0, None, 1]


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    vals = [0, 1, 1, 0, 1, 1, 1, 0, 1, 1] * 3
    lo, hi = bootstrap_ci(vals, 2000, 0.95, seed=0)
    mean = sum(vals) / len(vals)
    assert lo < mean < hi and 0 <= lo and hi <= 1
    assert (lo, hi) == bootstrap_ci(vals, 2000, 0.95, seed=0)
    lo2, hi2 = bootstrap_ci(vals * 10, 2000, 0.95, seed=0)
    assert hi2 - lo2 < hi - lo  # more problems, narrower interval
    assert bootstrap_ci([1, 1, 1], 100) == (1.0, 1.0)


def test_summarize_benchmark_metrics():
    correct = [[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    clusters = [[0, 0, 1, 1, 1], [None, 0, 0, 1, None]]
    correct_of = [{0: 1.0, 1: 0.0}, {0: 0.0, 1: 0.0}]
    m = summarize(
        correct,
        clusters,
        correct_of,
        lengths=[[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]],
        truncated=[[0, 0, 0, 0, 1], [0, 0, 0, 1, 1]],
        ks=[1, 2],
        maj_ks=[5],
        num_resamples=200,
    )
    assert m["pass_at_1"] == pytest.approx((0.4 + 0) / 2)
    assert m["pass_at_2"] == pytest.approx((0.7 + 0) / 2)
    assert "pass_at_8" not in m
    assert m["accuracy"] == pytest.approx(0.2)
    assert m["maj_at_5"] == 0.0  # problem 1: 3 votes for the wrong answer
    assert m["length/mean"] == 5.5 and m["length/median"] == 5.5
    assert m["length/truncated_frac"] == pytest.approx(0.3)
    assert m["pass_at_1_ci_low"] <= m["accuracy"] <= m["pass_at_1_ci_high"]
    with pytest.raises(ValueError, match="same number of samples"):
        summarize([[1, 0], [1]])


def test_a_k_above_n_is_an_error_not_a_missing_column():
    # five samples per problem: pass@8 does not exist, and used to vanish from the table without a word
    with pytest.raises(ValueError, match=r"^eval\.ks=\[1, 2, 8\]: k=8 is more than eval\.n=5 samples per problem"):
        summarize([[1, 1, 0, 0, 0]], ks=[1, 2, 8], num_resamples=10)
    with pytest.raises(ValueError, match=r"^eval\.maj_ks=\[6\]: k=6 is more than eval\.n=5"):
        summarize([[1, 1, 0, 0, 0]], [[0, 0, 1, 1, 1]], [{0: 1.0, 1: 0.0}], maj_ks=[6], num_resamples=10)
