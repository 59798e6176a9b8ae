"""TruthRL's ternary reward (rlexp.rewards.terms.Truthfulness): correct +1, abstain 0, wrong −1."""

import pytest

from rlexp.rewards.terms import Sample, Truthfulness


def _sample(text, answer="4"):
    return Sample("q", text, {"answer": answer, "scorer": "exact", "id": "r"}, 0, 5, False)


def test_three_outcomes():
    term = Truthfulness(answer_format="hash")
    res = term([_sample("2 + 2\n#### 4"), _sample("#### I don't know"), _sample("#### 5"), _sample("no answer 4")])
    # the last states no answer and does not abstain: wrong (no last-number fallback)
    assert res.scores == [1.0, 0.0, -1.0, -1.0]


def test_abstention_in_the_text_when_no_answer_is_stated_and_custom_values():
    term = Truthfulness(answer_format="hash", correct=2.0, abstain=0.5, wrong=-3.0)
    assert term([_sample("Honestly, I am not sure about this.")]).scores == [0.5]
    assert term([_sample("#### 4")]).scores == [2.0]
    assert term([_sample("#### 7")]).scores == [-3.0]


def test_bad_pattern_refused():
    with pytest.raises(ValueError, match="abstain_patterns"):
        Truthfulness(abstain_patterns=["("])
