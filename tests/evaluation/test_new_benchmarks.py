"""The benchmarks of issue 26, each composed through the benchmark config group (as `rlexp eval` does) and loaded from
a local file in its hub schema (tests/fixtures/benchmarks): MATH, Minerva Math, OlympiadBench, the MathArena sets
(HMMT Feb 2025, BRUMO 2025, CMIMC 2025, AIME 2026), MBPP, MBPP+, HumanEval+, LiveCodeBench (release files, date
window), APPS (difficulty filter), Codeforces (open-r1/codeforces); their answer checking; the suites; and a malformed
row named by its line."""

import base64
import json
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rlexp.config.paths import CONF_DIR
from rlexp.evaluation.runner import build_benchmarks
from rlexp.evaluation.sources import HubSource, decode_lcb_tests, last_boxed, lcb_release_files
from tests.conftest import compose_train

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"

FIXTURES = {
    "hendrycks_math": "hendrycks_math_test.jsonl",
    "minerva_math": "minerva_math_test.jsonl",
    "olympiadbench": "olympiadbench_test.jsonl",
    "hmmt_feb25": "hmmt_feb_2025.jsonl",
    "brumo25": "brumo_2025.jsonl",
    "cmimc25": "cmimc_2025.jsonl",
    "aime26": "aime_2026.jsonl",
    "mbpp": "mbpp_test.jsonl",
    "mbpp_plus": "mbpp_plus_test.jsonl",
    "humaneval_plus": "humaneval_plus_test.jsonl",
    "livecodebench": "livecodebench_test.jsonl",
    "apps": "apps_test.jsonl",
    "codeforces": "codeforces_test.jsonl",
}
# the suites' entries that are not in FIXTURES have their own tests (test_benchmarks.py, test_humaneval.py)
OLDER = {
    "math500": "math500_test.jsonl",
    "aime24": "aime24_train.jsonl",
    "aime25": "aime25_test.jsonl",
    "amc23": "amc_train.jsonl",
}


def bench(tmp_path, name, fixture=None, *extra):
    fixture = fixture or FIXTURES[name]
    cfg = compose_train(
        [
            "model=tiny",
            "tracker=none",
            f"benchmark={name}",
            f"benchmark.{name}.source.data_files={FIX / fixture}",
            *extra,
        ],
        tmp_path / "run",
        "eval",
    )
    return build_benchmarks(cfg.benchmark)[name]


def score(b, completions):
    recs = b.records()
    answers = [b.extractor(c, r) for c, r in zip(completions, recs)]
    return b.checker.check(answers, recs)


def py(code: str) -> str:
    return f"Solution:\n```python\n{code}\n```"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_new_entry_composes_and_loads_its_fixture(tmp_path, name):
    b = bench(tmp_path, name)
    recs = b.records()
    assert recs and all(r["question"].strip() for r in recs)
    assert len({r["id"] for r in recs}) == len(recs)
    header = (Path(CONF_DIR) / "benchmark" / f"{name}.yaml").read_text().splitlines()[0]
    assert header.startswith("# ")  # the source is named in the header


def test_hendrycks_math_answers_from_the_last_box(tmp_path):
    b = bench(tmp_path, "hendrycks_math")
    recs = b.records()
    assert [r["answer"] for r in recs] == ["2", "\\frac{1}{4}", "10"]  # \boxed{}, nested braces, \fbox{}
    assert recs[0]["metadata"] == {"subject": "Algebra", "level": "Level 3"}
    assert score(b, ["There are $\\boxed{2}$.", "\\boxed{0.25}", "\\boxed{10}"]) == [1.0, 1.0, 1.0]
    assert score(b, ["\\boxed{3}", "\\boxed{\\frac{1}{2}}", "10"]) == [0.0, 0.0, 0.0]  # no box: no answer
    assert last_boxed("so $\\boxed 5$.") == "5" and last_boxed("none") is None
    assert b.source.subsets == [
        "algebra",
        "counting_and_probability",
        "geometry",
        "intermediate_algebra",
        "number_theory",
        "prealgebra",
        "precalculus",
    ]


def test_minerva_and_its_problem_solution_mirror(tmp_path):
    b = bench(tmp_path, "minerva_math")
    assert [r["answer"] for r in b.records()] == ["1.6", "-0.2"]
    assert score(b, ["\\boxed{1.6}", "A = \\boxed{-\\frac{1}{5}}"]) == [1.0, 1.0]
    mirror = tmp_path / "mirror.jsonl"
    mirror.write_text(json.dumps({"problem": "p", "solution": "so $x = \\boxed{3}$"}) + "\n")
    assert [r["answer"] for r in HubSource("minerva", data_files=str(mirror))()] == ["3"]


def test_olympiadbench_context_and_multiple_answers(tmp_path):
    b = bench(tmp_path, "olympiadbench")
    recs = b.records()
    assert [r["answer"] for r in recs] == ["2", "2", "\\frac{3}{2}, -1"]
    assert recs[2]["question"].startswith("Let $x$ satisfy") and recs[2]["metadata"]["is_multiple_answer"] is True
    assert score(b, ["\\boxed{2}", "\\boxed{3}", "\\boxed{\\frac{3}{2}, -1}"]) == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "name,golds,good",
    [
        ("hmmt_feb25", ["103", "2\\sqrt{2}"], ["\\boxed{103}", "\\boxed{\\sqrt{8}}"]),
        ("brumo25", ["\\frac{5}{6}", "16"], ["\\boxed{5/6}", "\\boxed{16}"]),
        ("cmimc25", ["9", "9\\pi"], ["\\boxed{9}", "\\boxed{9\\pi}"]),
        ("aime26", ["24", "24"], ["\\boxed{24}", "the answer is 24"]),  # AIME: the last-number fallback
    ],
)
def test_matharena_sets(tmp_path, name, golds, good):
    b = bench(tmp_path, name)
    recs = b.records()
    assert [r["answer"] for r in recs] == golds and [r["id"] for r in recs] == ["p1", "p2"]
    assert score(b, good) == [1.0, 1.0]
    assert score(b, ["\\boxed{1}", "\\boxed{2}"]) == [0.0, 0.0]


def test_mbpp_runs_the_asserts_after_the_setup_code(tmp_path):
    b = bench(tmp_path, "mbpp")
    recs = b.records()
    assert recs[0]["question"].endswith('assert remove_Occ("PHP","P") == "H"')  # the task with its tests
    assert [r["metadata"]["entry_point"] for r in recs] == ["remove_Occ", "sort_matrix", "root2"]
    good = [py(r["answer"]) for r in recs]  # the reference solutions (root2 needs test_setup_code's "import math")
    assert score(b, good) == [1.0, 1.0, 1.0]
    # strip removes both ends' characters: right for "abcda" and "PHP", wrong for "hello" (2/3)
    bad = [py("def remove_Occ(s, ch):\n    return s.strip(ch)"), py("def sort_matrix(M): return M"), "no code"]
    assert score(b, bad) == [0.0, 0.0, 0.0]
    assert b.checker.last_results[0].startswith("failed (2/3 tests)")


def test_mbpp_plus_and_humaneval_plus_run_their_test_programs(tmp_path):
    b = bench(tmp_path, "mbpp_plus")
    (rec,) = b.records()
    assert rec["id"] == "Mbpp/2" and "assert set(similar_elements" in rec["question"]
    good = "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))"
    unsorted = "def similar_elements(a, b):\n    return tuple(set(a) & set(b)) if len(a) > 3 else ()"
    assert score(b, [py(good)]) == [1.0] and score(b, [py("def similar_elements(a, b):\n    return ()")]) == [0.0]
    assert score(b, [py(unsorted)]) in ([0.0], [1.0])  # set order: whatever it is, the program ran
    h = bench(tmp_path, "humaneval_plus")
    (rec,) = h.records()
    assert rec["id"] == "HumanEval/53" and rec["metadata"]["entry_point"] == "add"
    assert score(h, ["    return x + y\n"]) == [1.0]  # a body continues the stub
    assert score(h, [py("def add(x, y):\n    return x + y if x != 123 else 0")]) == [0.0]  # an added input fails


LCB_STDIN = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)"
LCB_CALL = "class Solution:\n    def arraySum(self, nums: List[int]) -> int:\n        return sum(nums)"


def test_livecodebench_tests_release_files_and_date_window(tmp_path):
    b = bench(tmp_path, "livecodebench")
    recs = b.records()
    assert [r["id"] for r in recs] == ["3500", "abc300_a"]
    call, stdin = recs[0]["metadata"]["tests"], recs[1]["metadata"]["tests"]
    assert call["kind"] == "call" and call["fn_name"] == "arraySum" and len(call["cases"]) == 3  # 1 public + 2 private
    assert call["cases"][1] == {"args": [[]], "expected": 0}  # decoded from base64/zlib/pickle
    assert stdin["kind"] == "stdio" and len(stdin["cases"]) == 2
    assert "starter code" in recs[0]["question"] and "class Solution" in recs[0]["question"]
    assert "stdin" in recs[1]["question"]
    assert score(b, [py(LCB_CALL), py(LCB_STDIN)]) == [1.0, 1.0]
    assert score(b, [py(LCB_CALL.replace("sum(nums)", "sum(nums) or 1")), py("print(3)")]) == [0.0, 0.0]
    # the contest-date window (LiveCodeBench's --start_date/--end_date) and the difficulty filter
    late = bench(tmp_path, "livecodebench", None, "benchmark.livecodebench.source.start_date=2024-08-01")
    assert [r["id"] for r in late.records()] == ["3500"]
    early = bench(tmp_path, "livecodebench", None, "benchmark.livecodebench.source.end_date=2024-01-01")
    assert [r["id"] for r in early.records()] == ["abc300_a"]
    assert lcb_release_files("release_v3") == ["test.jsonl", "test2.jsonl", "test3.jsonl"]
    assert lcb_release_files("v5") == ["test5.jsonl"] and lcb_release_files("v2_v3") == ["test2.jsonl", "test3.jsonl"]
    assert len(lcb_release_files("release_latest")) == 6
    with pytest.raises(ValueError, match="release_version='release_v9'"):
        lcb_release_files("release_v9")
    with pytest.raises(Exception, match="start_date='Aug 1' is not a YYYY-MM-DD date"):  # at construction
        bench(tmp_path, "livecodebench", None, "benchmark.livecodebench.source.start_date='Aug 1'")


def test_livecodebench_private_tests_refuse_pickled_objects():
    plain = base64.b64encode(zlib.compress(pickle.dumps(json.dumps([{"input": "1", "output": "1"}])))).decode()
    assert decode_lcb_tests(plain) == [{"input": "1", "output": "1"}]

    class Boom:
        def __reduce__(self):
            return (print, ("executed",))

    evil = base64.b64encode(zlib.compress(pickle.dumps(Boom()))).decode()
    with pytest.raises(ValueError, match="refusing to unpickle builtins.print"):
        decode_lcb_tests(evil)


def test_apps_difficulty_filter_and_both_test_kinds(tmp_path):
    b = bench(tmp_path, "apps")
    recs = b.records()
    assert [r["id"] for r in recs] == ["apps-4000", "apps-2"]  # the row without tests is left out
    assert recs[0]["question"].endswith("Use Standard Input format")
    assert recs[1]["metadata"]["tests"]["kind"] == "call" and recs[1]["metadata"]["tests"]["lenient"]
    assert recs[0]["answer"] == "print(sum(map(int, input().strip())))"  # the first reference solution
    digits = py(recs[0]["answer"])
    largest = py("def largest(xs):\n    return max(xs)")  # expected [5] accepts 5 (APPS's own checker)
    assert score(b, [digits, largest]) == [1.0, 1.0]
    assert score(b, [py("print(6)"), py("def largest(xs):\n    return min(xs)")]) == [0.0, 0.0]
    intro = bench(tmp_path, "apps", None, "benchmark.apps.source.difficulties=[introductory]")
    assert [r["id"] for r in intro.records()] == ["apps-4000"]


def test_codeforces_keeps_checkable_problems(tmp_path):
    b = bench(tmp_path, "codeforces", None, "benchmark.codeforces.checker.timeout=1")
    recs = b.records()
    # 2030B needs a checker (several right answers), 2030C is interactive: both are left out
    assert [r["id"] for r in recs] == ["cf-2030A", "cf-2030D"]
    assert len(recs[0]["metadata"]["tests"]["cases"]) == 3 and recs[0]["metadata"]["complete_tests"]
    assert len(recs[1]["metadata"]["tests"]["cases"]) == 1 and not recs[1]["metadata"]["complete_tests"]  # examples
    assert "## Example 1" in recs[0]["question"] and "## Input" in recs[0]["question"]
    sol = py("a, b = map(int, input().split())\nprint(a + b)")
    assert score(b, [sol, sol]) == [1.0, 1.0]
    assert score(b, [py("print(3)"), py("import time\ntime.sleep(100)")]) == [0.0, 0.0]
    assert b.checker.last_results[1].startswith("timeout")


def test_a_malformed_row_names_its_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    rows = [{"problem_idx": 1, "problem": "p", "answer": "1"}, {"problem_idx": 2, "problem": "", "answer": "2"}]
    bad.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")  # a blank line before row 2
    with pytest.raises(ValueError, match=r"row 2 \(line 3\): column 'problem' must be a non-empty string"):
        HubSource("matharena", data_files=str(bad))()
    lcb = tmp_path / "lcb.jsonl"
    row = json.loads((FIX / "livecodebench_test.jsonl").read_text().splitlines()[1])
    lcb.write_text(json.dumps(row) + "\n" + json.dumps({**row, "private_test_cases": "not tests"}) + "\n")
    with pytest.raises(ValueError, match="row 2: test cases are neither JSON"):
        HubSource("livecodebench", data_files=str(lcb))()
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"task_id": 1, "text": "t", "test_list": []}) + "\n")
    with pytest.raises(ValueError, match="row 1: column 'test_list' must be a non-empty list"):
        HubSource("mbpp", data_files=str(mbpp))()


def test_suites_group_the_entries(tmp_path):
    for suite, want in {
        "math_suite": {"math500", "minerva_math", "olympiadbench", "aime24", "aime25", "aime26", "amc23", "hmmt_feb25"},
        "code_suite": {"humaneval", "humaneval_plus", "mbpp", "mbpp_plus", "livecodebench", "codeforces"},
    }.items():
        cfg = compose_train(["model=tiny", "tracker=none", f"benchmark={suite}"], tmp_path / suite, "eval")
        assert want <= set(cfg.benchmark), set(cfg.benchmark)
        text = (Path(CONF_DIR) / "benchmark" / f"{suite}.yaml").read_text()
        assert "lm-evaluation-harness" in text  # whether we wrap it, and why not


def test_rlexp_list_benchmarks_shows_them():
    out = subprocess.run(
        [sys.executable, "-m", "rlexp", "list", "benchmarks"], capture_output=True, text=True, check=True
    ).stdout
    for name in [*FIXTURES, "math_suite", "code_suite"]:
        assert f"\n  {name} " in out, name


@pytest.mark.long
def test_eval_runs_every_new_entry_offline_on_the_tiny_model(tmp_path):
    """`rlexp eval` end to end on both suites, every entry from its local fixture (the tiny model's outputs are noise:
    what is tested is that generation, extraction, checking and pass@k with a CI run for each)."""
    from rlexp.runs.evaluation import run_eval

    files = {**FIXTURES, **OLDER}
    for suite, names in {
        "math_suite": ["math500", "minerva_math", "olympiadbench", "aime24", "aime25", "aime26", "amc23"]
        + ["hmmt_feb25", "brumo25", "cmimc25"],
        "code_suite": ["humaneval_plus", "mbpp", "mbpp_plus", "livecodebench", "codeforces"],
    }.items():
        overrides = [f"benchmark.{n}.source.data_files={FIX / files[n]}" for n in names]
        cfg = compose_train(
            ["model=tiny", "tracker=none", f"benchmark={suite}", "eval.limit=2", "eval.n=2", "eval.max_new_tokens=8"]
            + ["eval.bootstrap=20", *overrides],
            tmp_path / suite,
            "eval",
        )
        m = run_eval(cfg).metrics
        for n in names:
            assert f"eval/{n}/pass_at_1" in m and f"eval/{n}/pass_at_1_ci_low" in m, (n, sorted(m)[:20])
