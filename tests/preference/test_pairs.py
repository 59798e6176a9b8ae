"""rlexp.preference.pairs: pairs from scored groups, worked out by hand."""

import pytest

from rlexp.preference.pairs import Candidate, Pair, build_pairs, compare

C = Candidate


def test_odd_group_all_pairs_and_best_vs_worst():
    # a: reward 1, 5 tokens; b: reward 0, 3 tokens; c: reward 1, 7 tokens (three completions: an odd group)
    # a > b (reward), a > c (equal reward, shorter), c > b (reward): 3 pairs, no tie
    group = [C("a", 1.0, 5), C("b", 0.0, 3), C("c", 1.0, 7)]
    pairs, stats = build_pairs([group], mode="all", prefer_shorter=True)
    assert pairs == [Pair(0, 0, 1), Pair(0, 0, 2), Pair(0, 2, 1)]
    assert (stats.pairs, stats.tied_pairs, stats.no_pair_groups) == (3, 0, 0)
    # best = a (beats b and c), worst = b (loses to both)
    pairs, _ = build_pairs([group], mode="best_worst", prefer_shorter=True)
    assert pairs == [Pair(0, 0, 1)]
    # without prefer_shorter a and c tie: 2 pairs, 1 tie dropped
    pairs, stats = build_pairs([group], mode="all", prefer_shorter=False)
    assert pairs == [Pair(0, 0, 1), Pair(0, 2, 1)] and stats.tied_pairs == 1


def test_ties_are_dropped_and_a_tied_group_gives_nothing():
    # same reward, same length, different text: a tie in every mode
    group = [C("x", 1.0, 4), C("y", 1.0, 4)]
    for mode in ("all", "sampled", "best_worst"):
        pairs, stats = build_pairs([group], mode=mode, pairs_per_group=1)
        assert pairs == [] and stats.tied_pairs == 1 and stats.no_pair_groups == 1, mode


def test_a_group_with_one_distinct_answer_gives_no_pair():
    # three samples of the same text (rewards would agree anyway): one distinct answer
    group = [C("z", 0.0, 2), C("z", 0.0, 2), C("z", 0.0, 2)]
    pairs, stats = build_pairs([group, [C("p", 1.0, 1), C("q", 0.0, 1)]], mode="all")
    assert pairs == [Pair(1, 0, 1)]  # only the second group
    assert stats.single_answer_groups == 1 and stats.duplicate_completions == 2 and stats.pairs == 1
    assert stats.metrics()["pref/single_answer_groups"] == 1.0


def test_duplicates_count_once():
    # "w" twice and "v": one pair (w, v), not two
    group = [C("w", 1.0, 3), C("v", 0.0, 3), C("w", 1.0, 3)]
    pairs, stats = build_pairs([group], mode="all")
    assert pairs == [Pair(0, 0, 1)] and stats.duplicate_completions == 1


def test_shorter_wins_only_from_shorter_min_reward():
    # both wrong (0): a tie when shorter_min_reward=1; both correct (1): the shorter wins
    wrong = [C("p", 0.0, 3), C("q", 0.0, 9)]
    right = [C("r", 1.0, 9), C("s", 1.0, 3)]
    pairs, stats = build_pairs([wrong, right], mode="all", prefer_shorter=True, shorter_min_reward=1.0)
    assert pairs == [Pair(1, 1, 0)] and stats.tied_pairs == 1
    assert compare(wrong[0], wrong[1], True, None, 1e-9) == 1  # null: at any reward the shorter wins


def test_sampled_pairs_with_a_seed():
    # rewards 3 > 2 > 1 > 0, equal lengths: 6 decisive pairs in the order (0,1) (0,2) (0,3) (1,2) (1,3) (2,3);
    # random.Random(0).sample(range(6), 2) = [3, 5] -> (1,2), (2,3); seed 1 -> [1, 4] -> (0,2), (1,3)
    group = [C(t, r, 4) for t, r in zip("abcd", (3.0, 2.0, 1.0, 0.0))]
    pairs, _ = build_pairs([group], mode="sampled", pairs_per_group=2, seed=0)
    assert pairs == [Pair(0, 1, 2), Pair(0, 2, 3)]
    pairs, _ = build_pairs([group], mode="sampled", pairs_per_group=2, seed=1)
    assert pairs == [Pair(0, 0, 2), Pair(0, 1, 3)]
    pairs, _ = build_pairs([group], mode="sampled", pairs_per_group=10, seed=0)
    assert len(pairs) == 6  # fewer decisive pairs than asked: all of them


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="mode='pairs'"):
        build_pairs([], mode="pairs")
    with pytest.raises(ValueError, match="pairs_per_group=0"):
        build_pairs([], mode="sampled", pairs_per_group=0)
