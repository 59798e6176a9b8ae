"""SUPO's advantage (rlexp/algorithms/advantages/segments.py) on hand-built segment rows: GRPO over the episodes, not
over their rows, each row getting its episode's value; the episode's outcome is its last segment's reward."""

from __future__ import annotations

import pytest

from rlexp.algorithms.advantages.segments import episode_rows, supo
from tests.algorithms.batches import make_batch


def segment_batch(rewards, groups, episodes):
    """A hand batch whose rows are segments: ``episodes[i]`` = (episode_index, segment, segments) of row i."""
    batch = make_batch(rewards, groups)
    for record, (index, k, n) in zip(batch.records, episodes):
        record["episode"] = {"episode_index": index, "segment": k, "segments": n}
    return batch


def test_the_advantage_is_the_episodes_not_the_rows():
    # one group of two episodes: A summarised once (rows A0, A1; reward 1), B did not (row B0; reward 0)
    batch = segment_batch([1.0, 1.0, 0.0], [0, 0, 0], [(0, 0, 2), (0, 1, 2), (1, 0, 1)])
    # over the episodes: mean 0.5, Bessel std √((0.25 + 0.25) / 1) = 0.70711 → A: +0.70711, B: −0.70711, and A's
    # two rows share A's (GRPO over the three rows would give mean 2/3, std 0.57735: +0.57735, +0.57735, −1.1547)
    adv = supo(batch)
    assert adv.tolist() == pytest.approx([0.70711, 0.70711, -0.70711], abs=1e-4)
    assert batch.stats["supo/episodes"] == 2.0 and batch.stats["supo/rows_per_episode"] == 1.5
    assert batch.stats["supo/adv_abs_mean"] == pytest.approx(0.70711, abs=1e-4)


def test_the_episodes_outcome_is_its_last_segments_reward_and_groups_stay_apart():
    # group 0: episode 0 rows (0.2 on its first segment, 1.0 on its last), episode 1 (0.0); group 1: one episode
    # with the same episode_index 0 as group 0's (an episode is its group and its index)
    batch = segment_batch([0.2, 1.0, 0.0, 0.5], [0, 0, 0, 1], [(0, 0, 2), (0, 1, 2), (1, 0, 1), (0, 0, 1)])
    rep, index = episode_rows(batch)
    assert rep == [1, 2, 3] and index == [0, 0, 1, 2]  # the last segment's row stands for episode 0
    adv = supo(batch)
    # group 0 over (1.0, 0.0): ±0.70711; group 1 a singleton: 0
    assert adv.tolist() == pytest.approx([0.70711, 0.70711, -0.70711, 0.0], abs=1e-4)
    assert supo(batch, scale="none").tolist() == pytest.approx([0.5, 0.5, -0.5, 0.0])


def test_the_advantage_refuses_rows_without_segments():
    with pytest.raises(ValueError, match="rollout=supo"):
        supo(make_batch([1.0, 0.0], [0, 0]))
    with pytest.raises(ValueError, match="algorithm.advantage.scale"):
        supo(segment_batch([1.0], [0], [(0, 0, 1)]), scale="rows")
