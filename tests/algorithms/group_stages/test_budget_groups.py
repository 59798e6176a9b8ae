"""Knapsack RL's merge stage (rlexp/algorithms/group_stages/budget_groups.py) on hand-built batches: group ids,
zero-gradient shares and GRPO advantages over the merged groups, by hand."""

from __future__ import annotations

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.group_stages.budget_groups import merge_allocated_groups
from rlexp.core.batch import RolloutBatch
from rlexp.samplers.knapsack import UNITS_KEY

A = {"id": "a", "question": "qa", UNITS_KEY: 2}
B = {"id": "b", "question": "qb", UNITS_KEY: 1}
C = {"id": "c", "question": "qc", UNITS_KEY: 1}


def _batch(records, groups, reward):
    n = len(reward)
    r = torch.tensor(reward, dtype=torch.float32)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.ones(n, 3, dtype=torch.long),
        completion_mask=torch.ones(n, 3, dtype=torch.long),
        sampling_logprobs=torch.zeros(n, 3),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        prompts=["p"] * n,
        completions=["c"] * n,
        records=records,
        rewards=r[:, None],
        reward_names=["accuracy"],
        reward_weights=torch.tensor([1.0]),
        reward=r.clone(),
        reward_failures=torch.zeros(n, 1, dtype=torch.bool),
    )


def _allocated():
    # G = 2: prompt a has 2 units (groups 0, 1), b and c one each (groups 2, 3), as the trainer numbers them
    return _batch([A] * 4 + [B] * 2 + [C] * 2, [0, 0, 1, 1, 2, 2, 3, 3], [1, 0, 0, 0, 1, 1, 0, 1])


def test_a_prompts_units_become_one_group_and_advantages_span_them():
    batch = _allocated()
    unmerged = grpo(_allocated())
    out = merge_allocated_groups(batch, None)
    assert out.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 2, 2]
    # before: groups (1, 0) varies, (0, 0) and (1, 1) do not, (0, 1) varies -> 2 of 4 flat; after: a's (1, 0, 0, 0)
    # varies, b flat, c varies -> 1 of 3
    assert out.stats["knapsack/zero_gradient_units"] == pytest.approx(0.5)
    assert out.stats["knapsack/zero_gradient_groups"] == pytest.approx(1 / 3)
    assert out.stats["knapsack/merged_groups"] == 1.0 and out.stats["knapsack/group_rows_max"] == 4.0
    # GRPO over a's 4 rows: mean 0.25, Bessel std sqrt((0.75² + 3·0.25²)/3) = sqrt(0.25) = 0.5
    #   -> (0.75, −0.25, −0.25, −0.25) / (0.5 + 1e-6) = (1.5, −0.5, −0.5, −0.5); b: 0, 0; c: ∓0.5/0.7071 = ∓0.7071
    adv = grpo(out)
    s = 0.5 + 1e-6
    c = 0.5 / (2**0.5 * 0.5 + 1e-6)
    assert adv.tolist() == pytest.approx([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0.0, 0.0, -c, c], abs=1e-6)
    # per unit instead, a's second group (0, 0) had no signal and its first ±0.7071
    assert unmerged[:4].tolist() == pytest.approx([c, -c, 0.0, 0.0], abs=1e-6)


def test_only_adjacent_groups_of_one_record_merge():
    # a, b, a: the two a groups are not adjacent (not the sampler's layout): three groups stay
    batch = _batch([A, A, B, B, A, A], [0, 0, 1, 1, 2, 2], [1, 0, 1, 0, 1, 0])
    out = merge_allocated_groups(batch, None)
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2] and out.stats["knapsack/merged_groups"] == 0.0


def test_a_run_without_the_knapsack_sampler_is_refused():
    plain = [{"id": "a", "question": "qa"}] * 2 + [{"id": "b", "question": "qb"}] * 2
    with pytest.raises(ValueError, match="sampler=knapsack"):
        merge_allocated_groups(_batch(plain, [0, 0, 1, 1], [1, 0, 1, 1]), None)
    out = merge_allocated_groups(_batch(plain, [0, 0, 1, 1], [1, 0, 1, 1]), None, require_allocation=False)
    assert out.group_ids.tolist() == [0, 0, 1, 1] and out.stats["knapsack/zero_gradient_groups"] == 0.5


def test_the_metric_can_be_a_reward_term():
    # the total reward flat everywhere, the accuracy term not: null reads the total, metric=accuracy the term
    flat = _allocated()
    flat.reward = torch.zeros(8)
    assert merge_allocated_groups(flat, None).stats["knapsack/zero_gradient_groups"] == 1.0
    flat = _allocated()
    flat.reward = torch.zeros(8)
    out = merge_allocated_groups(flat, None, metric="accuracy")
    assert out.stats["knapsack/zero_gradient_groups"] == pytest.approx(1 / 3)
