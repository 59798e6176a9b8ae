"""KnowRL's consensus self-knowledge reward (rlexp/rewards/self_knowledge.py), worked by hand."""

import pytest

from rlexp.rewards.self_knowledge import (
    FeasibilityConsensus,
    JudgmentAccuracy,
    consensus,
    hidden_label,
    parse_feasibility,
)
from rlexp.rewards.terms import Sample


def _s(text, group, label=None):
    meta = {"feasibility": label} if label else {}
    return Sample("q", text, {"id": "r", "answer": "999", "scorer": "exact", "metadata": meta}, group, 5, False)


@pytest.mark.parametrize(
    "text, fmt, expected",
    [
        ("I could do it.\n#### Feasible.", "hash", "feasible"),
        ("#### infeasible", "hash", "infeasible"),
        ("#### UNFEASIBLE", "hash", "infeasible"),
        ("#### not feasible", "hash", "infeasible"),
        ("#### it isn't feasible", "hash", "infeasible"),
        ("<think>numbers are missing</think><answer>infeasible</answer>", "tag", "infeasible"),
        ("\\boxed{feasible}", "boxed", "feasible"),
        ("#### feasible or infeasible", "hash", None),  # both in the stated answer: no judgment
        ("it is feasible\n#### 42", "hash", None),  # a stated answer that is not a judgment: none
        ("It seems feasible... no, infeasible.", "hash", "infeasible"),  # no stated answer: the last word
        ("no idea at all", "hash", None),
        ("feasibility is hard to say", "hash", None),  # not the word itself
    ],
)
def test_parser(text, fmt, expected):
    assert parse_feasibility(text, fmt) == expected


def test_parser_without_fallback_reads_only_the_stated_answer():
    assert parse_feasibility("It is infeasible.", "hash", fallback_last_judgment=False) is None
    assert parse_feasibility("#### infeasible", "hash", fallback_last_judgment=False) == "infeasible"


def test_consensus_ties_and_missing_judgments():
    assert consensus(["feasible", "feasible", "infeasible", None]) == ("feasible", 2)
    assert consensus(["infeasible", None, None, None]) == ("infeasible", 1)  # missing judgments do not vote
    assert consensus(["feasible", "infeasible", None]) == (None, 1)  # a tie: no consensus
    assert consensus([None, None]) == (None, 0)


GROUPS = [
    # group 0: F, F, I, none -> consensus F (2 of the 3 judgments)
    ("#### feasible", 0),
    ("#### Feasible.", 0),
    ("#### infeasible", 0),
    ("no judgment here", 0),
    # group 1: I, F -> a tie, nobody scores
    ("#### infeasible", 1),
    ("#### feasible", 1),
    # group 2: no judgments at all
    ("blah", 2),
    ("#### 42", 2),
    # group 3 (no stated answers: the last judgment word): I, F, I -> consensus I
    ("I think it is not feasible", 3),
    ("#### feasible", 3),
    ("it is infeasible", 3),
]


def test_consensus_reward_by_hand():
    res = FeasibilityConsensus(answer_format="hash")([_s(t, g) for t, g in GROUPS])
    assert res.scores == [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1]
    assert res.failures == [False] * len(GROUPS)


def test_min_share_and_fallback():
    samples = [_s(t, g) for t, g in GROUPS]
    # group 0: 2 of 4 >= 0.5 * 4 kept; group 3: 2 of 3 >= 1.5 kept
    assert FeasibilityConsensus(min_share=0.5)(samples).scores == [1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1]
    # 0.75: group 0 needs 3 of 4, group 3 needs 2.25 of 3: neither
    assert FeasibilityConsensus(min_share=0.75)(samples).scores == [0.0] * len(GROUPS)
    # without the fallback group 3 has one judgment (#### feasible): it is its own consensus
    assert FeasibilityConsensus(fallback_last_judgment=False)(samples).scores == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    with pytest.raises(ValueError, match="min_share"):
        FeasibilityConsensus(min_share=1.5)


def test_judgment_accuracy_reads_the_hidden_label_and_is_missing_without_one():
    samples = [
        _s("#### feasible", 0, "feasible"),
        _s("#### infeasible", 0, "feasible"),
        _s("nothing", 0, "feasible"),
        _s("#### infeasible", 1, "infeasible"),
        _s("#### infeasible", 2),  # no hidden label
    ]
    res = JudgmentAccuracy()(samples)
    assert res.scores == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert res.missing == [False, False, False, False, True]
    assert JudgmentAccuracy().weight == 0.0
    assert hidden_label({"metadata": {"feasibility": "maybe"}}) is None and hidden_label({}) is None
