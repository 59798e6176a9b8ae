"""The column-mapping language of rlexp.data.hub: paths into nested rows, templates, answer-extraction rules,
multiple-choice options, row filters, and the errors that name the setting or the row."""

from __future__ import annotations

import json

import pytest

from rlexp.config.schema import ConfigError
from rlexp.data.hub import Spec, classify_tests, last_boxed, mapped_dataset, parse_path, resolve

ROW = {
    "prompt": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first turn"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "reward_model": {"ground_truth": '["4", "four"]', "style": "rule"},
    "extra_info.index": 7,  # a flattened export: a column whose own name has a dot
    "nums": [3, 5],
}


def _get(spec, row=ROW):
    return Spec.parse(spec, "dataset.columns.x").get(row)


@pytest.mark.parametrize(
    "path,value",
    [
        ("reward_model.style", "rule"),
        ("prompt[-1].content", "What is 2+2?"),
        ("prompt.0.content", "be brief"),
        ("prompt[role=user].content", "What is 2+2?"),  # the last user turn
        ("prompt[role=system].content", "be brief"),
        ("extra_info.index", 7),
        ("nums[1]", 5),
    ],
)
def test_paths_reach_nested_fields(path, value):
    assert resolve(ROW, path, parse_path(path, "k")) == value


def test_rules_in_order():
    assert _get({"path": "reward_model.ground_truth", "rules": ["json", "first"]}) == "4"
    assert _get({"path": "g", "rules": ["json"]}, {"g": "['a', 'b']"}) == ["a", "b"]  # a Python literal too
    assert (
        _get({"path": "s", "rules": ["last_boxed"]}, {"s": r"so \boxed{1} then \boxed{\frac{1}{2}}."}) == r"\frac{1}{2}"
    )
    assert _get({"path": "s", "rules": ["after_hash"]}, {"s": "3*400=1,200\n#### 1,200"}) == "1200"
    assert _get({"path": "s", "rules": [{"regex": r"Answer:\s*(\S+)"}]}, {"s": "Answer: 3\nAnswer: 5"}) == "5"
    assert _get({"path": "s", "rules": [{"remove_prefix": "Q: "}, "strip"]}, {"s": "Q: hi  "}) == "hi"
    assert _get({"path": "s", "rules": [{"remove_suffix": "!"}]}, {"s": "no suffix"}) == "no suffix"  # if present


def test_last_boxed_forms():
    assert last_boxed(r"\boxed{a{b}c}") == "a{b}c"
    assert last_boxed(r"\boxed{3} and then \fbox{7}") == "7"  # the last one, either command
    assert last_boxed(r"so $\boxed 5$.") == "5"
    assert last_boxed(r"\boxed{unclosed") is None and last_boxed("none") is None


def test_templates_constants_and_defaults():
    assert _get({"template": "Use {nums} to get {reward_model.style}."}) == "Use [3, 5] to get rule."
    assert (
        _get({"template": "Tests:\n{t|lines}"}, {"t": ["assert f(1)", "assert f(2)"]})
        == "Tests:\nassert f(1)\nassert f(2)"
    )
    assert _get({"value": "knights_knaves"}) == "knights_knaves"
    assert _get({"path": "absent", "default": None}) is None


def test_row_errors_name_the_path():
    with pytest.raises(ValueError, match=r"column 'prompt\[role=tool\]\.content': the row has no item with role=tool"):
        _get("prompt[role=tool].content")
    with pytest.raises(ValueError, match=r"column 'nums\[5\]': the row has no item 5 in 'nums' \(a list of 2\)"):
        _get("nums[5]")
    with pytest.raises(ValueError, match=r"column 's' has no \\boxed\{\.\.\.\} answer"):
        _get({"path": "s", "rules": ["last_boxed"]}, {"s": "no box"})


@pytest.mark.parametrize(
    "columns,message",
    [
        ({"question": "q", "answr": "a"}, r"dataset\.columns: unknown fields \['answr'\]"),
        ({"question": "q"}, r"dataset\.columns\.answer: required for scorer 'math'"),
        (
            {"question": "q", "answer": {"path": "a", "rules": ["boxed"]}},
            r"dataset\.columns\.answer\.rules: unknown rule 'boxed'",
        ),
        ({"question": "q", "answer": {"path": "a", "rules": ["regex"]}}, r"rule 'regex' needs an argument"),
        ({"question": "q[", "answer": "a"}, r"dataset\.columns\.question: path 'q\[' has an unclosed '\['"),
        ({"question": "q", "answer": {"path": "a", "value": 1}}, r"give exactly one of path, template, value"),
    ],
)
def test_bad_mapping_names_the_key(tmp_path, columns, message):
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "x", "a": "1"}\n')
    with pytest.raises(ConfigError, match=message):
        mapped_dataset(0, columns, path=str(path), eval_size=0)


def test_scorer_needs_its_fields(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "x", "a": "1"}\n')
    with pytest.raises(ConfigError, match=r"dataset\.columns\.tests: scorer 'code' needs the tests"):
        mapped_dataset(0, {"question": "q"}, path=str(path), scorer="code")
    with pytest.raises(ConfigError, match=r"dataset\.metadata\.source_dataset: scorer 'reasoning_gym' needs"):
        mapped_dataset(0, {"question": "q", "answer": "a"}, path=str(path), scorer="reasoning_gym")


def _jsonl(tmp_path, rows):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_options_make_a_multiple_choice_record(tmp_path):
    rows = [
        {"question": "2+2?", "choices": ["3", "4", "5"], "answer": 1},  # an index
        {"question": "Capital of France?", "choices": ["Rome", "Paris"], "answer": "Paris"},  # the option's text
        {"question": "Largest?", "choices": ["1", "9", "4"], "answer": "B"},  # a letter
    ]
    splits = mapped_dataset(
        0, {"question": "question", "answer": "answer", "options": "choices"}, path=_jsonl(tmp_path, rows), eval_size=1
    )
    got = {r["metadata"]["correct"]: r for r in splits.train + splits.eval}
    assert {k: r["answer"] for k, r in got.items()} == {"4": "B", "Paris": "B", "9": "B"}
    rec = got["4"]
    assert rec["scorer"] == "choice" and rec["metadata"]["letters"] == "ABC"
    assert rec["question"].startswith("2+2?\n\nOptions:\nA) 3\nB) 4\nC) 5\n")


def test_where_exclude_and_max_rows(tmp_path):
    rows = [{"q": f"q{i}", "a": str(i), "kind": "math" if i % 2 else "code"} for i in range(10)]
    path = _jsonl(tmp_path, rows)
    cols = {"question": "q", "answer": "a"}
    odd = mapped_dataset(0, cols, path=path, where={"kind": "math"}, eval_size=1)
    assert sorted(r["question"] for r in odd.train + odd.eval) == ["q1", "q3", "q5", "q7", "q9"]
    some = mapped_dataset(0, cols, path=path, exclude={"a": ["1", "3"]}, max_rows=6, eval_size=1)
    assert sorted(r["question"] for r in some.train + some.eval) == ["q0", "q2", "q4", "q5"]
    with pytest.raises(ConfigError, match=r"no row passes dataset\.where/exclude"):
        mapped_dataset(0, cols, path=path, where={"kind": "proof"}, eval_size=1)


def test_numeric_answers_and_ids(tmp_path):
    rows = [{"q": "a", "a": 27.0, "id": 11}, {"q": "b", "a": 0.5, "id": 12}, {"q": "c", "a": 3, "id": 13}]
    splits = mapped_dataset(
        0, {"question": "q", "answer": "a", "id": "id"}, name="s", path=_jsonl(tmp_path, rows), eval_size=1
    )
    got = {r["id"]: r["answer"] for r in splits.train + splits.eval}
    assert got == {"s-11": "27", "s-12": "0.5", "s-13": "3"}  # 27.0 (answers stored as floats) -> "27"


def test_classify_tests():
    assert classify_tests(["assert f(1) == 2"]) == "asserts"
    assert classify_tests({"inputs": ["1\n"], "outputs": ["2\n"]}) == "stdio"
    assert classify_tests({"inputs": [[1]], "outputs": [2], "fn_name": "f"}) == "call"
    assert classify_tests({"assert_case": ["assert f()"]}) == "asserts"
    assert classify_tests({"import_prefix": "", "test_code": "def check(f): ...", "entry_point": "f"}) == "check"


def test_loader_metadata_names_are_reserved(tmp_path):
    path = _jsonl(tmp_path, [{"q": "x", "a": "1", "source": "cn_k12"}])
    with pytest.raises(ConfigError, match=r"dataset\.metadata: \['source'\] are set by the loader"):
        mapped_dataset(0, {"question": "q", "answer": "a"}, path=path, metadata={"source": "source"})
