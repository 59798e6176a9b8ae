import pytest

from rlexp.rewards.answers import answer_span, extract_answer, math_equal
from rlexp.rewards.terms import Accuracy, Format, RewardTerm, Sample


@pytest.mark.parametrize(
    "text,fmt,expected",
    [
        ("3 + 4 = 7\n#### 7", "hash", "7"),
        ("#### 1\nthen\n#### 12.", "hash", "12"),
        ("<think>6*7</think><answer> 42 </answer>", "tag", "42"),
        ("so \\boxed{\\frac{1}{2}} done", "boxed", "\\frac{1}{2}"),
        ("no answer here", "auto", None),
        ("<answer>5</answer>", "auto", "5"),
    ],
)
def test_extract_answer(text, fmt, expected):
    assert extract_answer(text, fmt) == expected


def test_last_number_fallback_only_when_asked():
    assert extract_answer("the sum is 1,234 apples", "hash") is None
    assert extract_answer("the sum is 1,234 apples", "hash", fallback_last_number=True) == "1234"


@pytest.mark.parametrize(
    "text,fmt",
    [("reasoning\n#### 47", "hash"), ("<think>r</think><answer>47</answer>", "tag"), ("x \\boxed{47}", "boxed")],
)
def test_answer_span_covers_the_stated_answer(text, fmt):
    s, e = answer_span(text, fmt)
    assert text[s:e].strip() == "47"


@pytest.mark.parametrize(
    "pred,gold,ok",
    [
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "0.5", True),
        ("1,000", "1000", True),
        ("\\boxed{7}", "7", True),
        ("3", "4", False),
        ("x", "4", False),
    ],
)
def test_math_equal(pred, gold, ok):
    assert math_equal(pred, gold) is ok


def _sample(text, answer="7", scorer="math", metadata=None):
    rec = {"id": "r", "question": "q", "answer": answer, "scorer": scorer, "metadata": metadata or {}}
    return Sample("p", text, rec, 0, 5, False)


def test_accuracy_uses_math_verify_and_reasoning_gym_scorers():
    acc = Accuracy(answer_format="hash")
    assert acc([_sample("#### 7"), _sample("#### 8"), _sample("it is 7")]).scores == [1.0, 0.0, 1.0]
    rg = _sample("#### -4", answer="-4", scorer="reasoning_gym", metadata={"source_dataset": "basic_arithmetic"})
    assert acc([rg]).scores == [1.0]


def test_format_reward():
    f = Format(answer_format="hash")
    assert f([_sample("a\n#### 7"), _sample("#### 7\nmore"), _sample("7")]).scores == [1.0, 0.0, 0.0]
    t = Format(answer_format="tag")
    assert t([_sample("<think>a</think> <answer>7</answer>"), _sample("<answer>7</answer>")]).scores == [1.0, 0.0]


def test_format_reward_withholds_the_bonus_from_a_cut_off_completion_when_asked():
    # "#### 7" repeated up to the token cap ends on a "#### 7" line but has no end: 0 with require_end
    looped = Sample("p", "#### 7\n#### 7\n#### 7", {"answer": "7"}, 0, 48, True)
    ended = Sample("p", "3 + 4\n#### 7", {"answer": "7"}, 0, 6, False)
    assert Format(answer_format="hash")([looped, ended]).scores == [1.0, 1.0]
    assert Format(answer_format="hash", require_end=True)([looped, ended]).scores == [0.0, 1.0]


def test_failing_term_records_failure_instead_of_crashing():
    class Flaky(RewardTerm):
        def score(self, sample):
            if sample.completion == "boom":
                raise RuntimeError("scorer crashed")
            return 1.0

    res = Flaky()([_sample("ok"), _sample("boom")])
    assert res.scores == [1.0, 0.0] and res.failures == [False, True]
