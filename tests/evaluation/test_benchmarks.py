"""Each hub benchmark's parser, extractor and checker on a local file in the dataset's real schema
(tests/fixtures/benchmarks), composed through the benchmark config group as `rlexp eval` does."""

from pathlib import Path

import pytest

from rlexp.evaluation.runner import build_benchmarks
from rlexp.evaluation.sources import HubSource, parse_rows
from tests.conftest import compose_train

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def bench(tmp_path, name, fixture):
    cfg = compose_train(
        ["model=tiny", "tracker=none", f"benchmark={name}", f"benchmark.{name}.source.data_files={FIX / fixture}"],
        tmp_path / "run",
        "eval",
    )
    return build_benchmarks(cfg.benchmark)[name]


def score(b, completions):
    recs = b.records()
    answers = [b.extractor(c, r) for c, r in zip(completions, recs)]
    return answers, b.checker.check(answers, recs)


def test_gsm8k(tmp_path):
    b = bench(tmp_path, "gsm8k", "gsm8k_test.jsonl")
    recs = b.records()
    assert [r["answer"] for r in recs] == ["18", "3", "70000"]  # "#### 70,000" loses its separator
    assert recs[0]["question"].startswith("Janet")
    answers, scores = score(b, ["She makes 9 * 2 = 18.\n#### 18", "2 + 1 = 3 bolts.\n#### 3.", "Profit: #### 70,000"])
    assert answers == ["18", "3", "70,000"] and scores == [1.0, 1.0, 1.0]
    _, scores = score(b, ["#### 19", "so it takes 3 bolts", "#### $70,001"])
    assert scores == [0.0, 1.0, 0.0]  # the second: last-number fallback
    assert b.answer_format == "hash" and b.prompt.answer_format == "hash"


def test_math500_latex_fractions_and_boxed(tmp_path):
    b = bench(tmp_path, "math500", "math500_test.jsonl")
    recs = b.records()
    assert [r["id"] for r in recs] == [
        "test/precalculus/807.json",
        "test/algebra/2584.json",
        "test/number_theory/572.json",
    ]
    assert recs[1]["answer"] == "\\frac{14}{3}" and recs[1]["metadata"] == {"subject": "Algebra", "level": 3}
    good = [
        "So $(r,\\theta) = \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.",
        "Sum is $\\boxed{\\dfrac{14}{3}}$",
        "There are $\\boxed{9}$ divisors.",
    ]
    assert score(b, good)[1] == [1.0, 1.0, 1.0]
    alt = ["\\boxed{(3, \\pi/2)}", "\\boxed{14/3}", "\\boxed{9.0}"]
    assert score(b, alt)[1] == [1.0, 1.0, 1.0]
    bad = ["\\boxed{(3, \\pi)}", "\\boxed{\\frac{13}{3}}", "The answer is 9"]  # no box: no fallback for MATH
    answers, scores = score(b, bad)
    assert scores == [0.0, 0.0, 0.0] and answers[2] is None


@pytest.mark.parametrize(
    "name,fixture,golds",
    [
        ("aime24", "aime24_train.jsonl", ["204", "113"]),
        ("aime25", "aime25_test.jsonl", ["70", "735"]),
    ],
)
def test_aime(tmp_path, name, fixture, golds):
    b = bench(tmp_path, name, fixture)
    recs = b.records()
    assert [r["answer"] for r in recs] == golds
    assert score(b, [f"\\boxed{{{g}}}" for g in golds])[1] == [1.0, 1.0]
    assert score(b, [f"so the answer is {g}" for g in golds])[1] == [1.0, 1.0]  # last-number fallback
    assert score(b, ["\\boxed{1}", f"\\boxed{{{golds[1]}}} wait no \\boxed{{0}}"])[1] == [0.0, 0.0]


def test_amc23_filters_2023_and_formats_float_answers(tmp_path):
    b = bench(tmp_path, "amc23", "amc_train.jsonl")
    recs = b.records()
    assert [r["answer"] for r in recs] == ["27", "4", "2.5"]  # the 2022 row is dropped; 27.0 -> "27"
    assert all("2023" in r["metadata"]["url"] for r in recs)
    assert score(b, ["\\boxed{27}", "$m-n = \\boxed{4}$", "\\boxed{\\frac{5}{2}}"])[1] == [1.0, 1.0, 1.0]
    assert score(b, ["\\boxed{27.5}", "\\boxed{-4}", "\\boxed{\\frac{5}{3}}"])[1] == [0.0, 0.0, 0.0]


def test_gpqa_diamond_shuffles_options_and_checks_letters(tmp_path):
    b = bench(tmp_path, "gpqa_diamond", "gpqa_diamond.csv")
    recs = b.records()
    assert [r["id"] for r in recs] == ["recFixture0001", "recFixture0002"]
    for r, correct in zip(recs, ["The photon", "sp3"]):
        letter = r["answer"]
        assert letter in "ABCD"
        assert r["metadata"]["options"]["ABCD".index(letter)] == correct
        assert f"{letter}) {correct}" in r["question"]
        assert sorted(r["metadata"]["options"]) == sorted(set(r["metadata"]["options"]))
    # the shuffle is fixed per record (a second load gives the same letters), and depends on the seed
    again = bench(tmp_path, "gpqa_diamond", "gpqa_diamond.csv").records()
    assert [r["answer"] for r in again] == [r["answer"] for r in recs]
    letters = [r["answer"] for r in recs]
    wrong = ["ABCD".replace(l, "")[0] for l in letters]
    forms = [f"\\boxed{{{letters[0]}}}", f"\\boxed{{\\text{{({letters[1]})}}}}"]
    assert score(b, forms)[1] == [1.0, 1.0]
    assert score(
        b, [f"Thinking... The answer is ({letters[0]}).", f"{letters[1]}) is right, so \\boxed{{{letters[1]}) sp3}}"]
    )[1] == [1.0, 1.0]
    assert score(b, [f"\\boxed{{{w}}}" for w in wrong])[1] == [0.0, 0.0]
    rows = [
        {
            "Question": "q",
            "Correct Answer": "right",
            "Incorrect Answer 1": "w1",
            "Incorrect Answer 2": "w2",
            "Incorrect Answer 3": "w3",
            "Record ID": f"r{i}",
        }
        for i in range(40)
    ]
    shuffled = parse_rows(rows, "gpqa", "rows", seed=0)
    assert len({r["answer"] for r in shuffled}) == 4  # the correct option is not always A


def test_parser_errors_name_the_row_and_column(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "p", "answer": "1", "unique_id": "a"}\n{"problem": "q", "unique_id": "b"}\n')
    with pytest.raises(ValueError, match=r"row 2 has no column 'answer'"):
        HubSource("math500", data_files=str(bad))()
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match=r"row 1: GSM8K solution has no '####'"):
        HubSource("gsm8k", data_files=str(gsm))()
    with pytest.raises(ValueError, match="parser=.mmlu_redux."):
        HubSource("mmlu_redux", data_files=str(gsm))()


def test_hub_failure_says_how_to_go_offline(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError, match="data_files"):
        HubSource("math500", path="HuggingFaceH4/MATH-500", split="test")()


@pytest.mark.parametrize(
    "name, fixture, ids, correct",
    [
        ("mmlu_pro", "mmlu_pro.jsonl", ["70", "71"], ["Nitrogen", "56"]),
        ("mmlu_stem", "mmlu.jsonl", ["college_mathematics-0", "astronomy-1"], ["2x", "Jupiter"]),  # history left out
        ("arc_challenge", "arc_challenge.jsonl", ["Mercury_0001", "NYSEDREGENTS_0002"], ["elastic potential", "wind"]),
        ("commonsense_qa", "commonsense_qa.jsonl", ["075e483d21c29a511267ef62bedc0461"], ["cupboard"]),
    ],
)
def test_multiple_choice_benchmarks_parse_their_hub_schemas(tmp_path, name, fixture, ids, correct):
    """MMLU-Pro, MMLU-STEM, ARC-Challenge and CommonsenseQA from local files in their hub schemas: lettered options in
    the question, the letter as the answer, the options in the metadata (what the option-shuffle rate re-asks)."""
    from rlexp.data.multiple_choice import reshuffle

    b = bench(tmp_path, name, fixture)
    recs = b.records()
    assert [r["id"] for r in recs] == ids
    for r, right in zip(recs, correct):
        letters = r["metadata"]["letters"]
        assert r["metadata"]["options"][letters.index(r["answer"])] == right
        assert f"{r['answer']}) {right}" in r["question"]
        question, moved = reshuffle(r)  # every option to another letter
        assert f"{r['answer']}) {right}" not in question and sorted(moved) == sorted(r["metadata"]["options"])
    letters = [r["answer"] for r in recs]
    assert score(b, [f"\\boxed{{{l}}}" for l in letters])[1] == [1.0] * len(recs)
    assert score(b, [f"\\boxed{{{'A' if l != 'A' else 'B'}}}" for l in letters])[1] == [0.0] * len(recs)


def test_choice_parsers_name_a_bad_row(tmp_path):
    bad = tmp_path / "arc.jsonl"
    bad.write_text('{"question": "q", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}\n')
    with pytest.raises(ValueError, match=r"row 1: answerKey 'C' is not one of the labels"):
        HubSource("arc", data_files=str(bad))()
