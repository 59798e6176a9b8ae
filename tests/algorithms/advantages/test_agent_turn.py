"""AT-GRPO's agent- and turn-wise grouped advantage (rlexp/algorithms/advantages/agent_turn.py) on hand-built
(turn, candidate) rows, worked out by hand, against GRPO's prompt-wise groups."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.agent_turn import agent_turn_groups
from rlexp.algorithms.advantages.group import grpo
from tests.algorithms.batches import make_batch

H = 0.5 / (math.sqrt(0.5) + 1e-6)  # a pair {r, r + 1}: mean r + ½, Bessel std √½ -> ±½ / (√½ + ε) ≈ 0.7071


def tree_batch(rewards, groups, slots):
    batch = make_batch(rewards, groups)
    for record, (turn, k, agent) in zip(batch.records, slots):
        record["episode"] = {"slot": {"turn": turn, "candidate": k, "agent": agent, "chosen": False, "done": False}}
    return batch


def test_each_turns_candidates_are_one_group():
    # prompt 0 (K = 2, T = 2): turn 0 rewards {0, 1} -> ∓H; turn 1 {0.5, 0.5} -> 0 (no spread: 0 / (0 + ε))
    # prompt 1: turn 0 {1, 3}: mean 2, std √2 -> ∓1/√2 = ∓H; turn 1 never reached (turn −1, empty rows) -> 0
    rewards = [0.0, 1.0, 0.5, 0.5, 1.0, 3.0, 0.0, 0.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    slots = [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (0, 0, 0), (0, 1, 0), (-1, 0, 0), (-1, 1, 0)]
    batch = tree_batch(rewards, groups, slots)
    adv = agent_turn_groups(batch)
    assert adv.tolist() == pytest.approx([-H, H, 0, 0, -H, H, 0, 0], rel=1e-5)
    # GRPO pools the prompt's four rows: {0, 1, .5, .5}: mean .5, std √(.5/3) -> the turn-1 rows' reward looks average
    assert grpo(batch)[:4].tolist() == pytest.approx([-1.2247, 1.2247, 0, 0], rel=1e-4)
    s = batch.stats
    assert s["at_grpo/turn_groups"] == 3.0 and s["at_grpo/group_size_mean"] == 2.0  # the empty slots are no group
    assert s["at_grpo/varied_frac"] == pytest.approx(2 / 3)
    assert s["at_grpo/adv_abs_mean"] == pytest.approx(4 * H / 6, rel=1e-5)
    # scale=none only centres: turn 0 of prompt 0 -> ∓0.5
    assert agent_turn_groups(batch, scale="none")[:2].tolist() == pytest.approx([-0.5, 0.5])


def test_agents_of_one_turn_are_grouped_apart():
    # one turn, two agents with two candidates each: agent 0 {0, 1}, agent 1 {10, 11}; pooled they would be
    # {0, 1, 10, 11} and agent 0's both candidates would look bad
    batch = tree_batch([0.0, 1.0, 10.0, 11.0], [0] * 4, [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1)])
    assert agent_turn_groups(batch).tolist() == pytest.approx([-H, H, -H, H], rel=1e-5)


def test_rows_without_a_slot_are_refused():
    batch = make_batch([0.0, 1.0], [0, 0])
    with pytest.raises(ValueError, match=r"agent_turn_groups\) reads the turn-wise candidate groups"):
        agent_turn_groups(batch)
    assert torch.is_tensor(agent_turn_groups(tree_batch([0.0, 1.0], [0, 0], [(0, 0, 0), (0, 1, 0)])))
