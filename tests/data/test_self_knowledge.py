"""The self-knowledge view (rlexp/data/self_knowledge.py): records become feasible/infeasible questions."""

import pytest

from rlexp.data.self_knowledge import (
    FEASIBLE,
    INFEASIBLE,
    INSTRUCTION,
    MISSING,
    SelfKnowledgeView,
    remove_information,
)
from rlexp.data.sources import DatasetSplits
from rlexp.rewards.terms import check_answer


def _splits(questions):
    recs = [
        {"id": f"r{i}", "question": q, "answer": "7", "scorer": "math", "metadata": {"k": i}}
        for i, q in enumerate(questions)
    ]
    return DatasetSplits("toy", recs[:-1], recs[-1:])


def test_every_number_is_removed_and_named():
    task, removed = remove_information("Calculate 41 + 7.5 - 1,200.", "[?]")
    assert task == "Calculate [?] + [?] - [?]." and removed == ["41", "7.5", "1,200"]


def test_a_question_without_numbers_loses_its_second_half():
    # 5 words: the first 5 // 2 = 2 stay
    task, removed = remove_information("Who wrote the Iliad first?", "[?]")
    assert task == f"Who wrote {MISSING}" and removed == ["the Iliad first?"]


def test_records_become_self_knowledge_questions_with_a_hidden_label():
    view = SelfKnowledgeView(infeasible_share=1.0, placeholder="[?]")
    out = view(_splits(["What is 2 + 3?", "What is 4 + 4?"]))
    assert out.name == "toy:self_knowledge" and len(out.train) == 1 and len(out.eval) == 1
    r = out.train[0]
    assert r["question"] == f"Here is a task:\n\nWhat is [?] + [?]?\n\n{INSTRUCTION}"
    assert r["answer"] == INFEASIBLE and r["scorer"] == "exact" and r["id"] == "r0"
    meta = r["metadata"]
    assert meta["feasibility"] == INFEASIBLE and meta["removed"] == ["2", "3"] and meta["task"] == "What is [?] + [?]?"
    assert meta["source"] == {"answer": "7", "scorer": "math", "metadata": {"k": 0}}
    assert check_answer("infeasible", r) == 1.0 and check_answer("feasible", r) == 0.0
    kept = SelfKnowledgeView(infeasible_share=0.0)(_splits(["What is 2 + 3?", "x"])).train[0]
    assert kept["answer"] == FEASIBLE and "What is 2 + 3?" in kept["question"] and kept["metadata"]["removed"] == []


def test_the_share_is_drawn_per_record_deterministically():
    questions = [f"What is {i} + 1?" for i in range(201)]
    a = SelfKnowledgeView(seed=3)(_splits(questions))
    b = SelfKnowledgeView(seed=3)(_splits(questions))
    assert [r["answer"] for r in a.train] == [r["answer"] for r in b.train]
    share = sum(r["answer"] == INFEASIBLE for r in a.train) / len(a.train)
    assert 0.4 < share < 0.6  # 200 Bernoulli(0.5) draws
    other = SelfKnowledgeView(seed=4)(_splits(questions))
    assert [r["answer"] for r in a.train] != [r["answer"] for r in other.train]


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"infeasible_share": 1.5}, "view.infeasible_share"),
        ({"placeholder": " "}, "view.placeholder"),
        ({"placeholder": "number 1"}, "view.placeholder"),
        ({"instruction": ""}, "view.instruction"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        SelfKnowledgeView(**kwargs)
