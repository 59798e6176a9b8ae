"""Pairwise preferences, win rates and pair selection (rlexp.algorithms.group_stages.preference), by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.preference import (
    PAIRS,
    PREFERENCE,
    PairwisePreference,
    WinRate,
    group_positions,
    rule_preference,
    select_pairs,
    win_rates,
)
from tests.algorithms.batches import make_batch

NAN = float("nan")


def same(a: torch.Tensor, b) -> bool:
    b = torch.as_tensor(b, dtype=a.dtype)
    return bool(torch.allclose(a, b, equal_nan=True))


def test_group_positions_of_uneven_groups():
    pos, start, width = group_positions(torch.tensor([4, 4, 4, 7, 7]))
    assert pos.tolist() == [0, 1, 2, 0, 1] and start.tolist() == [0, 0, 0, 3, 3] and width == 3


def test_rule_preference_with_a_tie_and_an_odd_group():
    # group 0: rewards 1, 0, 1 (rows 0 and 2 tie); group 1: rewards 0.5, 0 (width 3: third column is padding)
    pref = rule_preference(
        torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0]), torch.tensor([5, 5, 5, 5, 5]), torch.tensor([0, 0, 0, 1, 1])
    )
    assert same(
        pref,
        [
            [NAN, 1.0, 0.5],
            [0.0, NAN, 0.0],
            [0.5, 1.0, NAN],
            [NAN, 1.0, NAN],
            [0.0, NAN, NAN],
        ],
    )


def test_shorter_wins_among_equal_rewards_from_the_threshold_only():
    # rows 0, 1 correct (reward 1) with lengths 10, 4: the shorter (row 1) wins; rows 2, 3 wrong (0) with lengths 3, 9:
    # below the threshold 1, they tie whatever their lengths
    pref = rule_preference(
        torch.tensor([1.0, 1.0, 0.0, 0.0]),
        torch.tensor([10, 4, 3, 9]),
        torch.tensor([0, 0, 0, 0]),
        shorter_wins_from=1.0,
    )
    assert same(pref[0], [NAN, 0.0, 1.0, 1.0])
    assert same(pref[1], [1.0, NAN, 1.0, 1.0])
    assert same(pref[2], [0.0, 0.0, NAN, 0.5])


def test_win_rates_count_ties_half_and_lone_rows_half():
    pref = torch.tensor([[NAN, 1.0, 0.5], [0.0, NAN, 0.0], [0.5, 1.0, NAN], [NAN, NAN, NAN]])
    # row 0: (1 + 0.5)/2; row 1: 0; row 2: (0.5 + 1)/2; row 3: no peer -> 1/2
    assert same(win_rates(pref), [0.75, 0.0, 0.75, 0.5])


def test_all_pairs_skip_ties_and_are_antisymmetric():
    ids = torch.tensor([0, 0, 0])
    pref = rule_preference(torch.tensor([1.0, 0.0, 1.0]), torch.ones(3), ids)
    pairs = select_pairs(pref, ids, "all")
    # pairs: (0 beats 1), (2 beats 1); the tie (0, 2) is none
    assert same(pairs, [[0, 1, 0], [-1, 0, -1], [0, 1, 0]])


def test_one_distinct_answer_gives_no_pair_in_every_mode():
    ids = torch.tensor([0, 0, 0, 0])
    pref = rule_preference(torch.ones(4), torch.ones(4), ids)
    for mode, k in (("all", None), ("sampled", 2), ("best_worst", None)):
        assert not select_pairs(pref, ids, mode, k, torch.Generator().manual_seed(0)).any(), mode


def test_best_worst_picks_the_extreme_win_rates():
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    pref = rule_preference(torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 0.0]), torch.ones(6), ids)
    pairs = select_pairs(pref, ids, "best_worst")
    # group 0: row 1 (wins 2 of 2) against row 0 (wins 0); group 1: win rates 0.75, 0.75, 0 -> the first best, row 3,
    # against row 5
    assert same(pairs[:3], [[0, -1, 0], [1, 0, 0], [0, 0, 0]])
    assert same(pairs[3:], [[0, 0, 1], [0, 0, 0], [-1, 0, 0]])


def test_sampled_pairs_keep_k_per_group_and_follow_the_seed():
    ids = torch.tensor([0] * 5)
    pref = rule_preference(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]), torch.ones(5), ids)  # 10 decided pairs
    a = select_pairs(pref, ids, "sampled", 3, torch.Generator().manual_seed(1))
    b = select_pairs(pref, ids, "sampled", 3, torch.Generator().manual_seed(1))
    assert int((a > 0).sum()) == 3 and torch.equal(a, b)
    assert torch.equal(a, -a.new_tensor(_transpose_within_group(a)))


def _transpose_within_group(pairs):
    # one group starting at row 0: pairs[i, j] = -pairs[j, i]
    return pairs.t().tolist()


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="pairs='best'"):
        PairwisePreference(pairs="best")
    with pytest.raises(ValueError, match="needs k >= 1"):
        PairwisePreference(pairs="sampled")
    with pytest.raises(ValueError, match="judge='model'"):
        PairwisePreference(judge="model")


def test_stages_write_extras_stats_and_the_win_rate_reward():
    batch = make_batch([1.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1])
    ctx = SimpleNamespace(step=1)
    batch = PairwisePreference()(batch, ctx)
    assert batch.extras[PREFERENCE].shape == (5, 3) and batch.extras[PAIRS].shape == (5, 3)
    assert batch.stats["pref/pairs_per_group"] == 1.0  # two pairs in group 0, none in group 1
    assert batch.stats["pref/no_pair_group_frac"] == 0.5
    assert math.isclose(batch.stats["pref/tie_frac"], 4 / 8)  # 8 comparisons: (0,2), (2,0), (3,4), (4,3) tie
    batch = WinRate()(batch, ctx)
    assert same(batch.reward, [0.75, 0.0, 0.75, 0.5, 0.5])
    assert same(batch.term("win_rate"), [0.75, 0.0, 0.75, 0.5, 0.5])


def test_disjoint_pairs_match_each_completion_at_most_once():
    ids = torch.tensor([0] * 5 + [1] * 4)
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 2.0])
    pairs = select_pairs(
        rule_preference(rewards, torch.ones(9), ids), ids, "disjoint", None, torch.Generator().manual_seed(3)
    )
    per_row = (pairs != 0).sum(-1)
    assert per_row.max() == 1
    # group 0 (five distinct rewards): two pairs, one completion left out
    assert int((pairs[:5] > 0).sum()) == 2 and int((per_row[:5] == 0).sum()) == 1
    # group 1 has a tie (1, 1): its match, if drawn, is no pair
    assert int((pairs[5:] > 0).sum()) in (1, 2)
