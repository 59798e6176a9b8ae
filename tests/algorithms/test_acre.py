"""ACRE's option-shuffle consistency reward (group_stages/consistency.py ShuffleConsistencyReward), by hand."""

import re
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.consistency import ShuffleConsistencyReward, acre_reward
from rlexp.data.multiple_choice import ChoiceView
from rlexp.data.sources import DatasetSplits
from tests.algorithms.batches import make_batch

TABLE = {"correct_consistent": 1.0, "correct_inconsistent": 0.5, "wrong_consistent": 0.0, "wrong_inconsistent": 0.0}


def test_reward_table_by_case():
    correct = torch.tensor([True, True, False, False])
    consistent = torch.tensor([True, False, True, False])
    assert acre_reward(correct, consistent, TABLE).tolist() == [1.0, 0.5, 0.0, 0.0]
    other = {**TABLE, "wrong_consistent": 0.2}
    assert acre_reward(correct, consistent, other).tolist() == pytest.approx([1.0, 0.5, 0.2, 0.0])


class ContentRollout:
    """Answers with the letter under which the (shuffled) prompt now lists the last number of the reasoning."""

    def __init__(self):
        self.calls = []

    def generate(self, model, tokenizer, texts, num_generations=1, greedy=False, max_new_tokens=None):
        self.calls.append((model, greedy, max_new_tokens, len(texts)))
        outs = []
        for t in texts:
            prompt, reasoning = t.split("|", 1)
            last = re.findall(r"-?\d+", reasoning)[-1]
            found = re.search(rf"^([A-D])\) {last}$", prompt, re.M)
            outs.append(f"{found.group(1) if found else 'A'}</answer>")
        return SimpleNamespace(texts=outs)


def test_stage_replaces_accuracy_with_the_acre_reward():
    recs = [
        {"id": f"r{i}", "question": f"What is {a} + 3?", "answer": str(a + 3), "scorer": "math"}
        for i, a in enumerate((12, 4))
    ]
    rec = ChoiceView(seed=0)(DatasetSplits("toy", recs[:1], recs[1:])).train[0]  # correct option: 15
    opts = rec["metadata"]["options"]
    right = "ABCD"[opts.index("15")]
    wrong_opt = next(o for o in opts if o != "15")
    wrong = "ABCD"[opts.index(wrong_opt)]
    # accuracy, format per row: (1, 1) right & supported; (1, 1) right letter but reasoning ends at another option;
    # (0, 1) wrong letter, reasoning supports it; (0, 0) no answer
    b = make_batch(None, [0, 0, 0, 0], terms=[[1, 1], [1, 1], [0, 1], [0, 0]], weights=[1.0, 0.5])
    b.reward_names = ["accuracy", "format"]
    b.records = [rec] * 4
    b.prompts = [rec["question"] + "|"] * 4
    b.completions = [
        f"<think>12 + 3 = 15.</think><answer>{right}</answer>",
        f"<think>so {wrong_opt}.</think><answer>{right}</answer>",
        f"<think>so {wrong_opt}.</think><answer>{wrong}</answer>",
        "<think>no idea</think>",
    ]
    rollout = ContentRollout()
    ctx = SimpleNamespace(policy="POLICY", reference=None, tokenizer=None, answer_format="tag", rollout=rollout)
    stage = ShuffleConsistencyReward(table=TABLE, max_new_tokens=8)
    stage(b, ctx)
    # consistent: rows 0 (15 again) and 2 (the wrong option again); row 1 re-picks wrong_opt; row 3 has no answer
    assert b.term("acre").tolist() == [1.0, 0.5, 0.0, 0.0]
    # total = 0.5 x format + ACRE reward (the accuracy weight moved to the acre column)
    assert b.reward.tolist() == pytest.approx([1.5, 1.0, 0.5, 0.0])
    assert b.reward_weights.tolist() == [0.0, 0.5, 1.0]
    assert b.stats["acre/consistent_frac"] == 0.5 and b.stats["acre/correct_consistent_frac"] == 0.25
    assert rollout.calls == [("POLICY", True, 8, 3)]  # the policy, greedy, only rows with an answer


def test_bad_settings_and_records_name_the_problem():
    with pytest.raises(ValueError, match="table keys"):
        ShuffleConsistencyReward(table={"correct_consistent": 1.0})
    with pytest.raises(ValueError, match="correct_consistent must be the highest"):
        ShuffleConsistencyReward(table={**TABLE, "wrong_consistent": 2.0})
    b = make_batch([1.0, 0.0], [0, 0])
    b.reward_names = ["accuracy"]
    b.records = [{"id": "q0", "question": "q", "answer": "1"}] * 2
    ctx = SimpleNamespace(policy=None, reference=None, tokenizer=None, answer_format="tag", rollout=ContentRollout())
    with pytest.raises(ValueError, match="record 'q0' has none: train with view=multiple_choice"):
        ShuffleConsistencyReward()(b, ctx)


def test_lcr_adds_a_drift_penalty_to_the_task_reward():
    recs = [
        {"id": f"r{i}", "question": f"What is {a} + 3?", "answer": str(a + 3), "scorer": "math"}
        for i, a in enumerate((12, 4))
    ]
    rec = ChoiceView(seed=0)(DatasetSplits("toy", recs[:1], recs[1:])).train[0]
    opts = rec["metadata"]["options"]
    right, wrong_opt = "ABCD"[opts.index("15")], next(o for o in opts if o != "15")
    b = make_batch([1.0, 1.0], [0, 0])
    b.reward_names, b.records, b.prompts = ["accuracy"], [rec] * 2, [rec["question"] + "|"] * 2
    b.completions = [
        f"<think>= 15.</think><answer>{right}</answer>",
        f"<think>{wrong_opt}</think><answer>{right}</answer>",
    ]
    ctx = SimpleNamespace(
        policy="POLICY", reference=None, tokenizer=None, answer_format="tag", rollout=ContentRollout()
    )
    table = {
        "correct_consistent": 0.0,
        "correct_inconsistent": -0.5,
        "wrong_consistent": 0.0,
        "wrong_inconsistent": -0.5,
    }
    ShuffleConsistencyReward(table=table, replace_accuracy=False, name="lcr")(b, ctx)
    assert b.term("lcr").tolist() == [0.0, -0.5] and b.reward.tolist() == [1.0, 0.5]  # accuracy kept, drift penalised
    assert b.reward_weights.tolist() == [1.0, 1.0]
