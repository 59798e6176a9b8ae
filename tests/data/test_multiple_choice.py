"""The multiple-choice view (rlexp/data/multiple_choice.py) and the ``choice`` scorer."""

import random

import pytest

from rlexp.data.multiple_choice import (
    INSTRUCTION,
    ChoiceView,
    derangement,
    numeric_distractors,
    options_block,
    reshuffle,
)
from rlexp.data.sources import DatasetSplits
from rlexp.rewards.answers import choice_letter
from rlexp.rewards.terms import check_answer


def _splits(answers):
    recs = [
        {"id": f"r{i}", "question": f"q{i}?", "answer": a, "scorer": "math", "metadata": {}}
        for i, a in enumerate(answers)
    ]
    return DatasetSplits("toy", recs[:-1], recs[-1:])


def test_integer_distractors_are_near_distinct_and_wrong():
    wrong = numeric_distractors("12", 3, random.Random(0))
    assert len(set(wrong)) == 3 and "12" not in wrong
    # span max(5, 30 % of 12 = 4) = 5: 7..17 without 12, or -12
    assert all(int(w) in range(7, 18) or int(w) == -12 for w in wrong)


def test_decimal_and_fraction_distractors_keep_the_notation():
    dec = numeric_distractors("2.50", 3, random.Random(1))
    assert all(len(d.split(".")[1]) == 2 and d != "2.50" for d in dec)
    frac = numeric_distractors("3/4", 3, random.Random(1))
    assert all("/" in f or f.lstrip("-").isdigit() for f in frac) and "3/4" not in frac
    assert numeric_distractors("Paris", 3, random.Random(0)) is None


def test_view_is_deterministic_and_letters_the_answer():
    splits = _splits(["12", "7", "30", "5"])
    a, b = ChoiceView(seed=3)(splits), ChoiceView(seed=3)(splits)
    assert a.train == b.train and a.name == "toy:choice"
    for r in a.train + a.eval:
        opts = r["metadata"]["options"]
        assert len(opts) == 4 and len(set(opts)) == 4
        assert opts["ABCD".index(r["answer"])] == r["metadata"]["correct"]
        assert r["scorer"] == "choice" and r["question"].endswith(INSTRUCTION)
        assert options_block(opts, "ABCD") in r["question"]
    assert ChoiceView(seed=4)(splits).train != a.train  # the seed moves the letters or the distractors


def test_short_text_answers_take_other_records_answers():
    splits = _splits(["red", "blue", "green", "black", "white"])
    r = ChoiceView(num_options=3)(splits).train[0]
    assert r["metadata"]["correct"] == "red" and set(r["metadata"]["options"]) <= {
        "red",
        "blue",
        "green",
        "black",
        "white",
    }
    with pytest.raises(ValueError, match="record 'r0'.*num_options"):
        ChoiceView(num_options=4)(_splits(["red", "blue", "green"]))
    with pytest.raises(ValueError, match="view.num_options"):
        ChoiceView(num_options=1)


def test_choice_scorer_reads_the_letter():
    rec = {"answer": "B", "scorer": "choice", "metadata": {"letters": "ABCD"}}
    assert check_answer("B", rec) == 1.0 and check_answer("(B) 15", rec) == 1.0
    assert check_answer("C", rec) == 0.0 and check_answer("15", rec) == 0.0
    assert choice_letter("\\text{(D)}") == "D" and choice_letter("E", "ABCD") is None
    # an answer that states an option's content counts as that option
    with_opts = {**rec, "metadata": {"letters": "ABCD", "options": ["12", "15", "9", "red car"]}}
    assert check_answer("15", with_opts) == 1.0 and check_answer("15.0", with_opts) == 1.0
    assert check_answer("12", with_opts) == 0.0 and check_answer("14", with_opts) == 0.0
    assert choice_letter("Red  Car", "ABCD", ["12", "15", "9", "red car"]) == "D"


def test_reshuffle_moves_every_option():
    rec = ChoiceView(seed=0)(_splits(["12", "7", "30", "5"])).train[0]
    question, moved = reshuffle(rec, seed=0)
    opts = rec["metadata"]["options"]
    assert sorted(moved) == sorted(opts) and all(m != o for m, o in zip(moved, opts))
    assert options_block(moved, "ABCD") in question and question != rec["question"]
    assert reshuffle(rec, seed=0) == (question, moved)
    order = derangement(5, random.Random(2))
    assert sorted(order) == list(range(5)) and all(order[j] != j for j in range(5))
    with pytest.raises(ValueError, match="not a multiple-choice record"):
        reshuffle({"id": "x", "question": "q", "metadata": {}})
