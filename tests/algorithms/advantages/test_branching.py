"""ARPO's advantage attribution (rlexp/algorithms/advantages/branching.py) on a hand-built branch tree: the shared
prefix lengths, the hard attribution's per-token means, and the part on a batch (soft is GRPO)."""

from __future__ import annotations

import pytest
import torch

from rlexp.algorithms.advantages.branching import arpo, hard_attribution, shared_lengths
from rlexp.algorithms.advantages.group import grpo
from tests.algorithms.batches import make_batch

# One group of four episodes (completion positions 0..9):
#   row 0: global, 10 tokens
#   row 1: global, 6 tokens
#   row 2: branched from row 0 after its first 4 tokens, 9 tokens
#   row 3: branched from row 2 after its first 6 tokens, 8 tokens (so it shares 4 with row 0)
PARENTS, SHARES, LENGTHS = [None, None, 0, 2], [0, 0, 4, 6], [10, 6, 9, 8]


def test_shared_lengths_follow_the_tree():
    assert shared_lengths(PARENTS, SHARES, LENGTHS) == [
        [10, 0, 4, 4],  # row 0 with row 3: the shortest share on the path 3 → 2 → 0 (6, then 4)
        [0, 6, 0, 0],  # another global episode shares nothing
        [4, 0, 9, 6],
        [4, 0, 6, 8],
    ]


def test_hard_attribution_gives_shared_tokens_the_mean_of_their_branches():
    A = torch.tensor([1.0, -1.0, 0.5, -0.5])
    out = hard_attribution(A, shared_lengths(PARENTS, SHARES, LENGTHS), 10)
    third = 1.0 / 3.0  # positions 0..3 of rows 0, 2, 3: (1 + 0.5 − 0.5) / 3
    want = [
        [third] * 4 + [1.0] * 6,  # after position 3 row 0 is on its own
        [-1.0] * 10,  # nothing shared (past its 6 tokens: its own, padding)
        [third] * 4 + [0.0] * 2 + [0.5] * 4,  # positions 4, 5 shared with row 3: (0.5 − 0.5) / 2
        [third] * 4 + [0.0] * 2 + [-0.5] * 4,
    ]
    assert torch.allclose(out, torch.tensor(want))


def branch_batch(rewards=(1.0, 0.0, 1.0, 0.0, 0.2, 0.6)):
    # group 0: the tree above; group 1: a global row of 5 tokens and its branch after 3 (5 tokens too)
    batch = make_batch(list(rewards), [0, 0, 0, 0, 1, 1], lengths=LENGTHS + [5, 5], width=10)
    tree = [(0, None, 0), (1, None, 0), (2, 0, 4), (3, 2, 6), (0, None, 0), (1, 0, 3)]
    for r, (index, parent, shared) in zip(batch.records, tree):
        r["episode"] = {"states": [], "branch": {"index": index, "parent": parent, "shared": shared}}
    return batch


def test_the_part_soft_is_grpo_and_hard_attributes_per_token():
    batch = branch_batch()
    soft = arpo(batch)
    assert torch.allclose(soft, grpo(batch)) and batch.stats["arpo/branched_rows_frac"] == pytest.approx(3 / 6)
    hard = arpo(batch, attribution="hard")
    A = grpo(batch)  # group 0: rewards (1, 0, 1, 0) → ±0.5 / std (Bessel 0.57735) = ±0.866; group 1: ∓0.7071
    g0 = hard_attribution(A[:4], shared_lengths(PARENTS, SHARES, LENGTHS), 10)
    g1 = hard_attribution(A[4:], [[5, 3], [3, 5]], 10)  # positions 0..2 shared: (−0.7071 + 0.7071) / 2 = 0
    assert torch.allclose(hard, torch.cat([g0, g1]))
    assert hard[4, :3].abs().max() < 1e-6 and hard[4, 3] == pytest.approx(float(A[4]))
    # shared valid tokens: rows 0, 2, 3 (4, 6, 6 of them), rows 4, 5 (3 each); row 1 none — their mean |A_hard − A|
    a = float(A[0])  # 0.866: rows 0, 2 have +a, row 3 −a; the mean of the three is a / 3
    moved = 4 * (a - a / 3) + (4 * (a - a / 3) + 2 * a) + (4 * (a + a / 3) + 2 * a) + 3 * abs(float(A[4])) * 2
    assert batch.stats["arpo/shared_adv_shift"] == pytest.approx(moved / (4 + 6 + 6 + 3 + 3), rel=1e-5)


def test_a_parent_left_out_of_the_batch_counts_as_a_root_and_missing_trees_are_refused():
    batch = branch_batch().select(torch.tensor([0, 1, 3]))  # row 2 (row 3's parent) left out: row 3 stands alone
    hard = arpo(batch, attribution="hard")
    assert torch.allclose(hard, grpo(batch)[:, None].expand(-1, 10))
    plain = make_batch([1.0, 0.0], [0, 0])
    with pytest.raises(ValueError, match=r"needs ARPO's branched episodes .* rollout=arpo"):
        arpo(plain)
    with pytest.raises(ValueError, match="algorithm.advantage.attribution"):
        arpo(branch_batch(), attribution="mean")
