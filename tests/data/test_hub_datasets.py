"""Every hub training set (issue 26) composes as `dataset=<entry>` and loads a local file in its real schema — a few
rows written here, in the file type the set ships as — into records with the right question, answer and scorer;
a malformed row is refused naming its file and line (jsonl) or row; offline, the hub error says how to use a local
file; `dataset=reasoning_gym` gives any task or a weighted mixture; `rlexp list datasets` shows them all."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlexp.config.catalog import format_group
from rlexp.config.schema import ConfigError
from rlexp.rewards.terms import check_answer
from rlexp.runs.setup import build
from tests.conftest import compose_train

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
EURUS_SYSTEM = "\nWhen tackling complex reasoning tasks, you have access to the following actions. [ASSESS] ..."
EURUS_SUFFIX = "\n\nPresent the answer in LaTex format: \\boxed{Your answer}"


def _write(tmp_path, rows, kind: str, name: str = "data") -> str:
    path = tmp_path / f"{name}.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise AssertionError(kind)
    return str(path)


def _load(entry: str, tmp_path, *overrides: str):
    cfg = compose_train([f"dataset={entry}", "dataset.eval_size=1", *overrides], tmp_path / "run")
    return build(cfg.dataset, "dataset")


def _records(splits) -> dict[str, dict]:
    return {r["question"]: r for r in splits.train + splits.eval}


def _verl(question, ground_truth, i, ability="math", system=None, source="math_dapo", extra=None):
    prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {
        "data_source": source,
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {"index": i, **(extra or {})},
    }


# ---------------------------------------------------------------- one case per entry: rows in the real schema


def math_train():
    rows = [
        {"problem": f"What is ${i}+{i}$?", "level": f"Level {i}", "type": "Algebra", "solution": s}
        for i, s in [
            (1, "We add: $1+1=\\boxed{2}$."),
            (2, "Since $2+2=4$, the answer is $\\boxed{4}$."),
            (3, "Clearly $\\boxed{\\frac{12}{2}}$."),
        ]
    ]
    want = {"What is $1+1$?": "2", "What is $2+2$?": "4", "What is $3+3$?": "\\frac{12}{2}"}
    return rows, "jsonl", want, "math"


def dapo_math():
    rows = [
        _verl(DAPO_PREFIX + f"Find {i} times {i}." + DAPO_SUFFIX, str(i * i), f"uuid-{i}", "MATH") for i in (2, 3, 4)
    ]
    return rows, "parquet", {f"Find {i} times {i}.": str(i * i) for i in (2, 3, 4)}, "math"


def deepscaler():
    rows = [
        {"problem": "Compute $7\\cdot 6$.", "answer": "42", "solution": "$7\\cdot 6 = 42$."},
        {"problem": "Solve $x+1=3$.", "answer": "2", "solution": "x=2"},
        {"problem": "Evaluate $2^5$.", "answer": "32", "solution": "32"},
    ]
    return rows, "json", {r["problem"]: r["answer"] for r in rows}, "math"


def big_math():
    rows = [
        {
            "problem": "What is 9 squared?",
            "answer": "81",
            "source": "orca_math",
            "domain": ["Algebra"],
            "llama8b_solve_rate": 0.8,
        },
        {
            "problem": "Sum of 1..10?",
            "answer": "55",
            "source": "cn_k12",
            "domain": ["Arithmetic"],
            "llama8b_solve_rate": None,
        },
        {"problem": "Half of 9?", "answer": "4.5", "source": "olympiads", "domain": [], "llama8b_solve_rate": 0.1},
    ]
    return rows, "parquet", {r["problem"]: r["answer"] for r in rows}, "math"


def openr1_math():
    rows = [
        {
            "problem": p,
            "solution": f"<think>...</think> so \\boxed{{{a}}}",
            "answer": a,
            "problem_type": "Algebra",
            "question_type": "math-word-problem",
            "source": "olympiads",
            "uuid": f"u{i}",
            "is_reasoning_complete": [True],
            "generations": ["..."],
            "correctness_math_verify": [True],
            "correctness_llama": None,
            "finish_reasons": None,
            "correctness_count": 1,
            "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "..."}],
        }
        for i, (p, a) in enumerate([("Find x if 2x=8.", "4"), ("What is 3!?", "6"), ("Find 10/4.", "\\frac{5}{2}")])
    ]
    return rows, "parquet", {r["problem"]: r["answer"] for r in rows}, "math"


def skywork_or1_math():
    diff = {"DeepSeek-R1-Distill-Qwen-1.5B": 4, "DeepSeek-R1-Distill-Qwen-32B": 14, "DeepSeek-R1-Distill-Qwen-7B": 9}
    rows = [
        _verl(q, json.dumps(gt), i, source="deepscaler", extra={"model_difficulty": diff})
        for i, (q, gt) in enumerate(
            [("What is 5+5?", ["10"]), ("Simplify 2/4.", ["\\frac{1}{2}", "0.5"]), ("What is 12-7?", ["5"])]
        )
    ]
    return rows, "parquet", {"What is 5+5?": "10", "Simplify 2/4.": "\\frac{1}{2}", "What is 12-7?": "5"}, "math"


def skywork_or1_code():
    stdio = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}
    call = {"inputs": [[[1, 2]]], "outputs": [3], "fn_name": "add"}
    rows = [
        _verl("Read two numbers and print their sum.", json.dumps(stdio), 0, "code", source="taco"),
        _verl("Write add(xs) returning the sum of the list.", json.dumps(call), 1, "code", source="leetcode"),
        _verl("Print hello.", json.dumps({"inputs": ["\n"], "outputs": ["hello\n"]}), 2, "code", source="taco"),
    ]
    return rows, "parquet", {r["prompt"][-1]["content"]: "" for r in rows}, "code"


def orz_math():
    rows = [
        [{"from": "human", "value": q}, {"from": "assistant", "ground_truth": {"value": a}}]
        for q, a in [("If 3x = 12, x = ?", "4"), ("What is 2^10?", "1024"), ("Compute 100-1.", "99")]
    ]
    return rows, "json", {"If 3x = 12, x = ?": "4", "What is 2^10?": "1024", "Compute 100-1.": "99"}, "math"


def numinamath_cot():
    rows = [
        {
            "source": "synthetic_math",
            "problem": f"Compute {i}*3.",
            "solution": f"It is $\\boxed{{{3 * i}}}$.",
            "messages": [{"role": "user", "content": f"Compute {i}*3."}, {"role": "assistant", "content": "..."}],
        }
        for i in (1, 2, 3)
    ]
    return rows, "parquet", {f"Compute {i}*3.": str(3 * i) for i in (1, 2, 3)}, "math"


def limr():
    rows = [
        {"prompt": "What is 6*7?", "answer": "42"},
        {"prompt": "What is 9-2?", "answer": "7"},
        {"prompt": "What is 1/4 + 1/4?", "answer": "\\frac{1}{2}"},
    ]
    return rows, "json", {r["prompt"]: r["answer"] for r in rows}, "math"


def eurus2_math():
    rows = [
        _verl("Find the sum 1+2+3." + EURUS_SUFFIX, "6", 0, system=EURUS_SYSTEM, source="numina_olympiads"),
        _verl("Find 2*8." + EURUS_SUFFIX, "16", 1, system=EURUS_SYSTEM, source="numina_cn_k12"),
        _verl("Find 9/3." + EURUS_SUFFIX, "3", 2, system=EURUS_SYSTEM, source="numina_synthetic_math"),
        _verl("Write a program.", json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]}), 3, "code", source="apps"),
    ]
    return rows, "parquet", {"Find the sum 1+2+3.": "6", "Find 2*8.": "16", "Find 9/3.": "3"}, "math"


def eurus2_code():
    rows = [
        _verl(
            "Read n and print n squared.",
            json.dumps({"inputs": ["3\n"], "outputs": ["9\n"]}),
            0,
            "code",
            source="codecontests",
        ),
        _verl(
            "Read a line and print it reversed.",
            json.dumps({"inputs": ["ab\n"], "outputs": ["ba\n"]}),
            1,
            "code",
            source="apps",
        ),
        _verl(
            "Print the first n primes.", json.dumps({"inputs": ["2\n"], "outputs": ["2 3\n"]}), 2, "code", source="taco"
        ),
        _verl("Find 2*8." + EURUS_SUFFIX, "16", 3, system=EURUS_SYSTEM, source="numina_cn_k12"),
    ]
    return rows, "parquet", {r["prompt"][-1]["content"]: "" for r in rows[:3]}, "code"


def mbpp_train():
    rows = [
        {
            "task_id": 601 + i,
            "text": text,
            "code": code,
            "test_list": tests,
            "test_setup_code": "",
            "challenge_test_list": [],
        }
        for i, (text, code, tests) in enumerate(
            [
                (
                    "Write a function to add two numbers.",
                    "def add(a, b):\n    return a + b",
                    ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
                ),
                (
                    "Write a function to square a number.",
                    "def sq(x):\n    return x * x",
                    ["assert sq(2) == 4", "assert sq(3) == 9", "assert sq(0) == 0"],
                ),
                (
                    "Write a function to reverse a string.",
                    "def rev(s):\n    return s[::-1]",
                    ["assert rev('ab') == 'ba'", "assert rev('') == ''", "assert rev('a') == 'a'"],
                ),
            ]
        )
    ]
    want = {f"{r['text']}\nYour code should pass these tests:\n" + "\n".join(r["test_list"]): r["code"] for r in rows}
    return rows, "jsonl", want, "code"


def countdown_tinyzero():
    rows = [
        {"target": 98, "nums": [44, 19, 35]},
        {"target": 64, "nums": [63, 95, 96]},
        {"target": 28, "nums": [95, 11, 56]},
    ]
    want = {
        f"Using the numbers {json.dumps(r['nums'])}, create an equation that equals {r['target']}. You can use basic "
        "arithmetic operations (+, -, *, /) and each number can only be used once.": str(r["target"])
        for r in rows
    }
    return rows, "parquet", want, "reasoning_gym"


def knights_knaves_logicrl():
    rows = [
        {
            "quiz": "A very special island is inhabited only by knights and knaves. You meet 2 inhabitants: "
            f"{a} and {b}. {a} says that {b} is a knave. {b} says {a} is a knight. Who is a knight and who is a knave?",
            "names": [a, b],
            "knight_knave": {"knight": "knight", "knave": "knave"},
            "solution": [sa, sb],
            "solution_text": f"{a} is a {'knight' if sa else 'knave'}, and {b} is a {'knight' if sb else 'knave'}.",
            "solution_text_format": f"(1) {a} is a {'knight' if sa else 'knave'}\n(2) {b} is a ...",
            "statements": "(('lying', 1), ('telling-truth', 0))",
        }
        for a, b, sa, sb in [
            ("Ella", "Zoey", True, False),
            ("Henry", "Amelia", False, True),
            ("Jack", "Mia", True, False),
        ]
    ]
    return rows, "jsonl", {r["quiz"]: r["solution_text"] for r in rows}, "reasoning_gym"


def gsm8k():
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "A car costs 1,200 dollars and a bike 300. Total?", "answer": "1,200+300\n#### 1,500"},
        {"question": "Half of 10?", "answer": "10/2=5\n#### 5"},
    ]
    return rows, "jsonl", {r["question"]: r["answer"].rsplit("#### ", 1)[1].replace(",", "") for r in rows}, "math"


CASES = {
    f.__name__: f
    for f in [
        math_train,
        dapo_math,
        deepscaler,
        big_math,
        openr1_math,
        skywork_or1_math,
        skywork_or1_code,
        orz_math,
        numinamath_cot,
        limr,
        eurus2_math,
        eurus2_code,
        mbpp_train,
        countdown_tinyzero,
        knights_knaves_logicrl,
        gsm8k,
    ]
}


@pytest.mark.parametrize("entry", sorted(CASES))
def test_entry_loads_a_local_file_in_its_real_schema(tmp_path, entry):
    rows, kind, want, scorer = CASES[entry]()
    path = _write(tmp_path, rows, kind)
    got = _records(_load(entry, tmp_path, f"dataset.path={path}"))
    assert set(got) == set(want)  # every row became a record (and a filtered-out row did not)
    for question, answer in want.items():
        rec = got[question]
        assert rec["scorer"] == scorer
        assert rec["metadata"]["source"] == f"dataset.path={path}"
        if scorer == "code":
            assert rec["tests"] and rec["metadata"]["tests_format"] in ("asserts", "stdio", "call")
            assert rec["answer"] == answer
        else:
            assert rec["answer"] == answer
    if scorer == "math":  # the gold answer scores 1 under the record's own scorer
        rec = next(iter(got.values()))
        assert check_answer(rec["answer"], rec) == 1.0


def test_code_entries_keep_their_tests(tmp_path):
    rows, kind, _, _ = mbpp_train()
    got = _records(_load("mbpp_train", tmp_path, f"dataset.path={_write(tmp_path, rows, kind)}"))
    rec = next(r for r in got.values() if r["id"] == "mbpp_train-601")
    assert rec["tests"] == ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"]
    assert rec["metadata"]["tests_format"] == "asserts" and rec["metadata"]["test_setup_code"] == ""
    rows, kind, _, _ = skywork_or1_code()
    got = _records(_load("skywork_or1_code", tmp_path, f"dataset.path={_write(tmp_path, rows, kind, 'sky')}"))
    call = got["Write add(xs) returning the sum of the list."]
    assert call["tests"] == {"inputs": [[[1, 2]]], "outputs": [3], "fn_name": "add"}
    assert call["metadata"]["tests_format"] == "call"
    assert got["Print hello."]["metadata"]["tests_format"] == "stdio"


def test_reasoning_gym_scored_hub_sets_score_their_gold(tmp_path):
    rows, kind, _, _ = countdown_tinyzero()
    got = _records(_load("countdown_tinyzero", tmp_path, f"dataset.path={_write(tmp_path, rows, kind)}"))
    rec = next(r for r in got.values() if r["metadata"]["target"] == 98)
    assert rec["metadata"]["numbers"] == [44, 19, 35]
    assert check_answer("44 + 19 + 35", rec) == 1.0 and check_answer("44 + 19", rec) < 0.1
    rows, kind, _, _ = knights_knaves_logicrl()
    got = _records(_load("knights_knaves_logicrl", tmp_path, f"dataset.path={_write(tmp_path, rows, kind, 'kk')}"))
    rec = next(r for r in got.values() if "Ella" in r["question"])
    assert check_answer("Ella is a knight, and Zoey is a knave.", rec) == 1.0
    assert check_answer("Ella is a knave, and Zoey is a knight.", rec) == 0.0


def test_skywork_keeps_every_accepted_answer(tmp_path):
    rows, kind, _, _ = skywork_or1_math()
    got = _records(_load("skywork_or1_math", tmp_path, f"dataset.path={_write(tmp_path, rows, kind)}"))
    rec = got["Simplify 2/4."]
    assert rec["answer"] == "\\frac{1}{2}" and rec["metadata"]["answers"] == ["\\frac{1}{2}", "0.5"]
    assert rec["metadata"]["model_difficulty"]["DeepSeek-R1-Distill-Qwen-7B"] == 9


def test_gsm8k_mapping_matches_the_fixed_parser(tmp_path):
    from rlexp.data.sources import gsm8k

    fixture = "tests/fixtures/data/gsm8k_sample.jsonl"
    mapped = _load("gsm8k", tmp_path, f"dataset.data_files={fixture}")  # the older key still works
    fixed = gsm8k(seed=0, data_files=fixture, eval_size=1)
    assert sorted(r["answer"] for r in mapped.train + mapped.eval) == sorted(
        r["answer"] for r in fixed.train + fixed.eval
    )


# ---------------------------------------------------------------- malformed rows, offline hub


def test_malformed_jsonl_row_names_its_line(tmp_path):
    rows = [_verl(f"Q{i}?", str(i), i) for i in range(4)]
    rows[2]["reward_model"]["ground_truth"] = None
    path = tmp_path / "dapo.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + "".join(json.dumps(r) + "\n" for r in rows[1:]))  # line 2 blank
    with pytest.raises(ConfigError) as e:
        _load("dapo_math", tmp_path, f"dataset.path={path}")
    assert str(e.value) == f"dataset: dataset.path={path} line 4: column 'reward_model.ground_truth' is null"


def test_missing_nested_field_names_line_and_path(tmp_path):
    rows = [_verl(f"Q{i}?", str(i), i) for i in range(3)]
    del rows[1]["reward_model"]["ground_truth"]
    path = _write(tmp_path, rows, "jsonl")
    with pytest.raises(ConfigError) as e:
        _load("dapo_math", tmp_path, f"dataset.path={path}")
    assert str(e.value) == (
        f"dataset: dataset.path={path} line 2: column 'reward_model.ground_truth': the row has no 'ground_truth' under "
        "'reward_model' (its fields: ['style'])"
    )


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{"problem": "b", "answer": \n')
    with pytest.raises(ConfigError, match=r"d\.jsonl line 2 is not valid JSON"):
        _load("deepscaler", tmp_path, f"dataset.path={path}")


def test_parquet_row_without_boxed_answer_is_refused_or_skipped(tmp_path):
    rows, _, _, _ = numinamath_cot()
    rows.append({**rows[0], "problem": "Prove that 2 is prime.", "solution": "It has no divisors but 1 and 2."})
    path = _write(tmp_path, rows, "parquet")
    splits = _load("numinamath_cot", tmp_path, f"dataset.path={path}")  # invalid_rows: skip (the set's default)
    assert "Prove that 2 is prime." not in _records(splits) and len(_records(splits)) == 3
    with pytest.raises(ConfigError) as e:
        _load("numinamath_cot", tmp_path, f"dataset.path={path}", "dataset.invalid_rows=error")
    assert (
        str(e.value)
        == f"dataset: dataset.path={path} row 4: column 'solution' has no \\boxed{{...}} answer (rule 'last_boxed')"
    )


def test_hub_failure_says_how_to_use_a_local_file(tmp_path, monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'BytedTsinghua-SIA/DAPO-Math-17k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError) as e:
        _load("dapo_math", tmp_path)
    msg = str(e.value)
    assert msg.startswith(
        "dataset: dataset.hub=BytedTsinghua-SIA/DAPO-Math-17k:train: could not load it from the Hugging Face hub"
    )
    assert "set dataset.path=<" in msg


def test_url_failure_says_how_to_use_a_local_file(tmp_path, monkeypatch):
    import urllib.request

    def offline(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty download cache
    with pytest.raises(
        ConfigError, match=r"^dataset: dataset\.url=https://raw\.githubusercontent\.com/.*set dataset\.path=<"
    ):
        _load("orz_math", tmp_path)


# ---------------------------------------------------------------- reasoning gym: one entry, any task, mixtures


def test_reasoning_gym_entry_takes_any_task(tmp_path):
    splits = _load("reasoning_gym", tmp_path, "dataset.task=gcd", "dataset.train_size=20", "dataset.eval_size=5")
    assert splits.name == "reasoning_gym/gcd" and len(splits.train) == 20 and len(splits.eval) == 5
    rec = splits.train[0]
    assert rec["scorer"] == "reasoning_gym" and rec["metadata"]["source_dataset"] == "gcd"
    assert check_answer(rec["answer"], rec) == 1.0


def test_reasoning_gym_weighted_mixture(tmp_path):
    splits = _load(
        "reasoning_gym",
        tmp_path,
        "dataset.tasks={chain_sum: 3, gcd: {weight: 1, options: {min_numbers: 2, max_numbers: 2}}}",
        "dataset.train_size=200",
        "dataset.eval_size=20",
    )
    counts = Counter(r["metadata"]["source_dataset"] for r in splits.train)
    assert set(counts) == {"chain_sum", "gcd"} and 0.65 < counts["chain_sum"] / 200 < 0.85  # weight 3 of 4
    assert not {r["question"] for r in splits.train} & {r["question"] for r in splits.eval}
    for task in ("chain_sum", "gcd"):
        rec = next(r for r in splits.train if r["metadata"]["source_dataset"] == task)
        assert check_answer(rec["answer"], rec) == 1.0


@pytest.mark.parametrize(
    "overrides,message",
    [
        ([], r"^dataset: dataset\.task / dataset\.tasks: set one"),
        (
            ["dataset.task=no_such_task"],
            r"^dataset: dataset\.task='no_such_task': not a reasoning-gym task; tasks: .*chain_sum",
        ),
        (["dataset.task=gcd", "dataset.tasks={chain_sum: 1}"], r"^dataset: dataset\.task / dataset\.tasks: set one"),
        (["dataset.tasks={chain_sum: 0}"], r"^dataset: dataset\.tasks\.chain_sum: weight 0 must be a positive number"),
    ],
)
def test_reasoning_gym_entry_refuses_bad_settings(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        _load("reasoning_gym", tmp_path, *overrides)


def test_list_datasets_shows_every_entry_and_marks_the_hub():
    text = format_group("datasets")
    for entry in [*CASES, "reasoning_gym"]:
        assert f"  {entry} " in text, entry
    hub_lines = [line for line in text.splitlines() if "hub " in line]
    assert len(hub_lines) >= len(CASES) - 2  # orz_math downloads from GitHub (url)
