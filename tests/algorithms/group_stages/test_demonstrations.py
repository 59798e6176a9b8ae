"""The demonstration rows of the SFT–RL hybrids (rlexp/algorithms/group_stages/demonstrations.py): LUFFY's in-group
replacement, CHORD's separate expert groups, their marks, scores and per-part weights, worked out by hand with a
character tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.demonstrations import Demonstrations, part_weights
from rlexp.core.masks import DEMO_PART_WEIGHT, DEMONSTRATION, LOSS_MASK, REPLAYED, UNSCORED
from rlexp.rewards.terms import RewardTerm
from tests.algorithms.batches import make_batch

EOS = 99


class CharTokenizer:
    """One token per character (its code point); EOS = 99."""

    eos_token_id = EOS

    def __call__(self, text, add_special_tokens=False):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}


class EndsWithAnswer(RewardTerm):
    """1 when the completion's last line is '#### <record answer>', else 0."""

    def score(self, sample) -> float:
        return float(sample.completion.strip().splitlines()[-1] == f"#### {sample.record['answer']}")


def record(a: int, b: int) -> dict:
    return {"question": f"What is {a} + {b}?", "answer": str(a + b), "metadata": {"expression": f"{a} + {b}"}}


def batch_of(records: list[dict], g: int, rewards=None):
    """``len(records)`` groups of ``g`` rows each (rollouts of 2 tokens), scored 0 by the term ``r``."""
    n = len(records) * g
    batch = make_batch(rewards or [0.0] * n, [i // g for i in range(n)])
    batch.records = [records[i // g] for i in range(n)]
    return batch


def ctx(answer_format="hash"):
    return SimpleNamespace(
        tokenizer=CharTokenizer(), answer_format=answer_format, reward_terms={"r": EndsWithAnswer()}, policy=None
    )


def test_in_group_replaces_the_last_rollout_of_each_group_and_scores_the_demonstration():
    # two groups of 3 rollouts (rewards 0.1 .. 0.6); the records' demonstrations are "1 + 2 = 3\n#### 3" (9 + 1 + 6
    # = 16 chars) and "10 + 20 = 30\n#### 30" (12 + 1 + 7 = 20 chars), + EOS: 17 and 21 tokens
    b = batch_of([record(1, 2), record(10, 20)], 3, rewards=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    out = Demonstrations(mode="in_group", per_group=1)(b, ctx())
    assert len(out) == 6  # G stays 3: two rollouts and the demonstration
    assert out.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    assert out.extras[DEMONSTRATION].tolist() == [False, False, True, False, False, True]
    assert out.extras[REPLAYED].tolist() == [False, False, True, False, False, True]
    # the kept rollouts are the first two of each group, their rewards unchanged; the demonstrations score 1
    assert out.reward.tolist() == pytest.approx([0.1, 0.2, 1.0, 0.4, 0.5, 1.0])
    assert out.completions[2] == "1 + 2 = 3\n#### 3" and out.completions[5] == "10 + 20 = 30\n#### 30"
    text = "1 + 2 = 3\n#### 3"
    assert out.completion_ids[2, :17].tolist() == [ord(c) for c in text] + [EOS]
    assert out.completion_mask.sum(-1).tolist() == [2, 2, 17, 2, 2, 21]
    assert out.completion_ids.shape[1] == 21  # re-padded to the widest row
    assert out.sampling_logprobs[2].abs().sum() == 0 and not out.truncated[2]  # π_φ = 1
    assert out.prompts[2] == b.prompts[0] and out.records[5] == b.records[3]
    assert out.stats["demo/rows"] == 2 and out.stats["demo/missing"] == 0 and out.stats["demo/replaced"] == 2
    assert out.stats["demo/reward_mean"] == 1.0 and out.stats["demo/tokens_mean"] == 19.0
    # part weights: 46 loss tokens, 38 of them in the demonstrations, 8 in the rollouts
    w = out.extras[DEMO_PART_WEIGHT]
    assert w.tolist() == pytest.approx([46 / 8, 46 / 8, 46 / 38, 46 / 8, 46 / 8, 46 / 38])


def test_in_group_per_group_two_and_a_record_without_a_demonstration():
    no_demo = {"question": "Name a colour.", "answer": "red"}
    b = batch_of([no_demo, record(1, 2)], 4)
    out = Demonstrations(mode="in_group", per_group=2)(b, ctx())
    # group 0 keeps its 4 rollouts; group 1: 2 rollouts and 2 copies of the demonstration
    assert out.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert out.extras[DEMONSTRATION].tolist() == [False] * 6 + [True] * 2
    assert out.stats["demo/rows"] == 2 and out.stats["demo/missing"] == 1


def test_in_group_refuses_to_replace_the_whole_group():
    b = batch_of([record(1, 2)], 2)
    with pytest.raises(ValueError, match="per_group=2 must be below the group's 2 completions"):
        Demonstrations(mode="in_group", per_group=2)(b, ctx())


def test_separate_adds_expert_groups_after_the_step_groups():
    # 4 prompts, expert_ratio 0.25: ⌈1⌉ = 1 expert row, from the first prompt with a demonstration (the second)
    no_demo = {"question": "Name a colour.", "answer": "red"}
    b = batch_of([no_demo, record(1, 2), record(3, 4), record(5, 6)], 2, rewards=[0.5] * 8)
    out = Demonstrations(mode="separate", expert_ratio=0.25)(b, ctx())
    assert len(out) == 9
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4]  # a group of its own
    assert out.extras[DEMONSTRATION].tolist() == [False] * 8 + [True]
    assert out.records[8] == b.records[2] and out.reward[:8].tolist() == [0.5] * 8 and out.reward[8] == 1.0
    assert out.stats["demo/rows"] == 1 and out.stats["demo/missing"] == 1 and out.stats["demo/replaced"] == 0


def test_separate_ratio_counts_prompts():
    # ⌈0.5 × 4 prompts⌉ = 2 expert rows (the first two prompts), group ids 4 and 5
    b = batch_of([record(1, 2), record(3, 4), record(5, 6), record(7, 8)], 2)
    out = Demonstrations(mode="separate", expert_ratio=0.5)(b, ctx())
    assert out.extras[DEMONSTRATION].sum() == 2 and out.group_ids[-2:].tolist() == [4, 5]


def test_existing_extras_are_carried_and_filled():
    b = batch_of([record(1, 2)], 3)
    b.extras[LOSS_MASK] = torch.tensor([1.0, 0.0, 1.0])  # a stage before dropped row 1 from the loss
    b.extras["token_x"] = torch.ones(3, 2)  # a token-aligned extra
    b.extras["scalar"] = 7  # not per row: kept as it is
    out = Demonstrations(mode="in_group")(b, ctx())
    assert out.extras[LOSS_MASK].tolist() == [1.0, 0.0, 1.0]  # the demonstration enters whole
    assert out.extras["token_x"].shape == out.completion_ids.shape and out.extras["token_x"][2].sum() == 0
    assert out.extras["scalar"] == 7 and out.extras[UNSCORED].tolist() == [False] * 3
    # part weights on the loss mask: rollouts 2 tokens (row 1 is out), the demonstration 17: 19 in all
    assert out.extras[DEMO_PART_WEIGHT].tolist() == pytest.approx([19 / 2, 19 / 2, 19 / 17])


def test_too_long_and_nothing_added():
    b = batch_of([record(1, 2)], 2)
    out = Demonstrations(mode="in_group", max_tokens=10)(b, ctx())  # 17 tokens > 10
    assert out is b and len(out) == 2 and REPLAYED not in out.extras  # the plain update path
    assert out.extras[DEMONSTRATION].tolist() == [False, False] and out.extras[DEMO_PART_WEIGHT].tolist() == [1, 1]
    assert out.stats["demo/rows"] == 0 and out.stats["demo/too_long"] == 1


def test_tag_format_and_policy_eos():
    b = batch_of([record(1, 2)], 2)
    c = ctx("tag")
    c.policy = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[7, 8]))  # the rollout stops at 7
    out = Demonstrations()(b, c)
    assert out.completions[1] == "<think>1 + 2 = 3</think><answer>3</answer>"
    n = int(out.completion_mask[1].sum())
    assert out.completion_ids[1, n - 1] == 7


def test_part_weights_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    w = part_weights(mask, torch.tensor([False, True, False]))
    # 6 tokens: the demonstration row 3 of them (weight 6/3), the others 3 (6/3)
    assert w.tolist() == [2.0, 2.0, 2.0]
    w = part_weights(mask, torch.tensor([False, False, True]))  # rest 5, demo 1
    assert w.tolist() == pytest.approx([6 / 5, 6 / 5, 6.0])
    assert part_weights(mask, torch.zeros(3, dtype=torch.bool)).tolist() == [1.0, 1.0, 1.0]


def test_settings_are_checked():
    with pytest.raises(ValueError, match="mode='mixed'"):
        Demonstrations(mode="mixed")
    with pytest.raises(ValueError, match="per_group=0"):
        Demonstrations(per_group=0)
    with pytest.raises(ValueError, match="expert_ratio=0"):
        Demonstrations(mode="separate", expert_ratio=0)
    with pytest.raises(RuntimeError, match="reward terms"):
        Demonstrations()(batch_of([record(1, 2)], 2), SimpleNamespace(tokenizer=CharTokenizer(), reward_terms=None))
