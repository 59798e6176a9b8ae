"""The code reward (rlexp/rewards/code.py) by hand: a passing, a partially passing, a failing, a non-compiling and a
timing-out completion of an MBPP-style record (shares of passed tests worked out in the comments), the other test
shapes records carry (HumanEval body + check, stdin/stdout, call-based, pytest modules), the metrics it reports, and a
two-step training run of the tiny model with it on MBPP-style records in a local file."""

import json

import pytest

from rlexp.execution.testcases import extract_code, normalize_tests, run_tests, suite_of
from rlexp.rewards.code import CodeTests
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run

ADD = {
    "id": "add",
    "question": "Write add(a, b).",
    "answer": "",
    "scorer": "code",
    "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
    "metadata": {},
}


def sample(completion: str, record: dict = ADD) -> Sample:
    return Sample("prompt", completion, record, 0, 10, False)


def fenced(body: str, prose: str = "Here is my solution:") -> str:
    return f"{prose}\n```python\n{body}\n```\n"


def test_pass_partial_fail_compile_error_timeout_by_hand():
    term = CodeTests(timeout=0.5, workers=2, max_total=5)
    completions = [
        fenced("def add(a, b):\n    return a + b"),  # 4/4
        # a * b when a == 2 (2*2 = 4 passes), +1 at a == 0 (add(0, 0) = 1 fails): 3/4
        fenced("def add(a, b):\n    return a * b if a == 2 else a + b + (a == 0)"),
        fenced("def add(a, b):\n    return 0"),  # passes add(0, 0) and add(-1, 1) only: 2/4
        fenced("def add(a, b):\n    return 7"),  # 0/4
        fenced("def add(a, b) return a"),  # does not compile: 0
        fenced("def add(a, b):\n    while True:\n        pass"),  # every test runs out of time: 0
    ]
    res = term([sample(c) for c in completions])
    assert res.scores == [1.0, 0.75, 0.5, 0.0, 0.0, 0.0]
    assert res.failures == [False] * 6 and res.missing == [False] * 6
    m = res.metrics
    assert m["compile_errors"] == 1 and m["timeouts"] == 1 and m["no_code"] == 0 and m["load_errors"] == 0
    assert m["pass_rate"] == pytest.approx((1 + 0.75 + 0.5) / 6)
    assert m["all_passed_frac"] == pytest.approx(1 / 6)
    assert m["tests_run"] == 5 * 4  # every program that compiled ran its 4 tests
    assert m["throughput"] == pytest.approx(6 / m["seconds"]) and m["throughput"] > 0


def test_all_or_nothing_and_the_last_block_is_the_program():
    strict = CodeTests(partial_credit=False)
    first_try = fenced("def add(a, b):\n    return 0", "A first try:")
    two_blocks = first_try + fenced("def add(a, b):\n    return a + b", "Fixed:")
    res = strict([sample(fenced("def add(a, b):\n    return 0")), sample(two_blocks)])
    assert res.scores == [0.0, 1.0]  # 2/4 is 0 without partial credit; the last block is the one run
    first = CodeTests(pick="first")([sample(two_blocks)])
    assert first.scores == [0.5]


def test_no_code_no_tests_and_unreadable_tests():
    term = CodeTests()
    no_tests = {**ADD, "tests": None, "id": "none"}
    bad = {**ADD, "tests": {"inputs": [1, 2], "outputs": [1]}, "id": "bad"}  # lengths differ
    res = term([sample("def add(a, b): return a + b  (no fence)"), sample(fenced("x = 1"), no_tests), sample("", bad)])
    assert res.scores == [0.0, 0.0, 0.0]
    assert res.missing == [False, True, False]  # no tests: the term does not apply
    assert res.failures == [False, False, True]  # unreadable tests: a failure of the term on that sample
    assert res.metrics["no_code"] == 1
    # without require_fence the whole completion is the program
    loose = CodeTests(require_fence=False)([sample("def add(a, b):\n    return a + b\n")])
    assert loose.scores == [1.0]


def test_humaneval_style_record_body_and_full_function():
    check = (
        "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n"
        "    assert candidate(5) == 7\n"
    )
    rec = {
        "id": "he",
        "question": "q",
        "answer": "",
        "metadata": {"prompt": "def inc(x):\n    '''x + 1'''\n", "test": check, "entry_point": "inc"},
    }
    # the check's three asserts become three tests (candidate bound to inc): x + 1 passes two of them
    suite = suite_of(rec)
    assert suite["cases"] == ["assert candidate(1) == 2", "assert candidate(2) == 3", "assert candidate(5) == 7"]
    term = CodeTests()
    body = fenced("    return x + 1")  # continues the prompt's stub
    full = fenced("def inc(x):\n    return x + 2 if x == 5 else x + 1")
    assert term([sample(body, rec), sample(full, rec)]).scores == [pytest.approx(2 / 3), 1.0]


def test_stdin_and_call_based_tests_get_partial_credit():
    stdio = {"id": "s", "tests": {"inputs": ["1 2\n", "3 4\n", "10 -10\n"], "outputs": ["3\n", "7\n", "0\n"]}}
    call = {"id": "c", "tests": {"inputs": ["[1, 2]", "[]"], "outputs": ["3", "0"], "fn_name": "total"}}
    term = CodeTests()
    wrong_on_negatives = fenced("a, b = map(int, input().split())\nprint(a + b if b > 0 else 1)")  # 2/3
    leetcode = fenced("class Solution:\n    def total(self, nums: List[int]) -> int:\n        return sum(nums)")
    res = term([sample(wrong_on_negatives, stdio), sample(leetcode, call)])
    assert res.scores == [pytest.approx(2 / 3), 1.0]


def test_pytest_module_and_assert_case_shapes():
    tc = (
        "from solution import mul\n\ndef test_one():\n    assert mul(2, 3) == 6\n\n"
        "def test_two():\n    assert mul(0, 5) == 1\n"
    )
    rec = {"id": "p", "tests": {"test_code": tc, "entry_point": "mul", "import_prefix": "import math"}}
    assert CodeTests()([sample(fenced("def mul(a, b):\n    return a * b"), rec)]).scores == [0.5]
    rec2 = {"id": "a", "tests": json.dumps({"assert_case": ["assert mul(2, 3) == 6"]})}  # a JSON string, as hub sets
    assert CodeTests()([sample(fenced("def mul(a, b):\n    return a * b"), rec2)]).scores == [1.0]


def test_extraction_and_normalisation_details():
    text = "```cpp\nint main() {}\n```\n```python\nprint(1)\n```\n```\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"  # the last Python (or untagged) block; C++ is skipped
    assert extract_code(text, pick="first") == "print(1)\n"
    assert extract_code("no block") is None and extract_code("no block", require_fence=False) == "no block"
    assert normalize_tests("assert f(1) == 1\nassert f(2) == 2")["cases"] == ["assert f(1) == 1", "assert f(2) == 2"]
    with pytest.raises(ValueError, match="record 'x' tests"):
        suite_of({"id": "x", "tests": {"what": 1}})


def test_a_crashing_or_memory_hungry_program_costs_only_its_own_tests():
    suite = normalize_tests(["assert f() == 1", "assert g() == 2"])
    crash = run_tests("import os\ndef f():\n    return 1\ndef g():\n    os._exit(3)\n", suite)
    assert crash.cases == ["passed", "error"] and crash.passed == 1  # the child died in test 2: test 1 still counts
    hog = run_tests("def f():\n    return 1\ndef g():\n    x = bytearray(4 * 1024 ** 3)\n", suite, memory_mb=512)
    assert hog.cases == ["passed", "error"] and "MemoryError" in hog.detail
    # a test that turns off its own timer is killed at the program's overall limit; the tests before it still count
    sneaky = "import signal\ndef f():\n    return 1\ndef g():\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
    sneaky += "    while True:\n        pass\n"
    killed = run_tests(sneaky, suite, timeout=0.5, max_total=2)
    assert killed.cases == ["passed", "timeout"] and killed.status == "timeout" and killed.fraction == 0.5


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="CodeTests.timeout"):
        CodeTests(timeout=0)
    with pytest.raises(ValueError, match="CodeTests.pick"):
        CodeTests(pick="middle")
    with pytest.raises(ValueError, match="CodeTests.max_tests"):
        CodeTests(max_tests=0)


MBPP_ROWS = [
    ("add", "Write a function to add two numbers.", "def add(a, b):\n    return a + b", ["assert add(1, 2) == 3"]),
    ("sub", "Write a function to subtract b from a.", "def sub(a, b):\n    return a - b", ["assert sub(3, 2) == 1"]),
    ("mul", "Write a function to multiply two numbers.", "def mul(a, b):\n    return a * b", ["assert mul(2, 3) == 6"]),
    ("neg", "Write a function to negate a number.", "def neg(a):\n    return -a", ["assert neg(2) == -2"]),
    ("sq", "Write a function to square a number.", "def sq(a):\n    return a * a", ["assert sq(3) == 9"]),
    ("inc", "Write a function to add one to a number.", "def inc(a):\n    return a + 1", ["assert inc(1) == 2"]),
    ("dbl", "Write a function to double a number.", "def dbl(a):\n    return 2 * a", ["assert dbl(4) == 8"]),
    ("one", "Write a function that returns one.", "def one():\n    return 1", ["assert one() == 1"]),
]


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_two_training_steps_with_the_code_reward(tmp_path, tiny_cfg):
    """The tiny model writes no code (reward 0), but the path runs end to end and the term's metrics are logged."""
    path = tmp_path / "mbpp_style.jsonl"
    rows = [
        {
            "task_id": 600 + i,
            "text": text,
            "code": code,
            "test_list": tests,
            "test_setup_code": "",
            "challenge_test_list": [],
        }
        for i, (_, text, code, tests) in enumerate(MBPP_ROWS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tiny_cfg(
        "dataset=mbpp_train",
        f"dataset.path={path}",
        "dataset.eval_size=2",
        "reward=code_tests",
        "prompt=code",
        "trainer.num_generations=2",
        "trainer.max_new_tokens=8",
        "trainer.autocast=off",
    )
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2
    for key in ("pass_rate", "compile_errors", "timeouts", "no_code", "throughput", "seconds", "tests_run"):
        assert f"reward/code/{key}" in m, sorted(k for k in m if k.startswith("reward/"))
    assert m["reward/code/throughput"] > 0
    assert m["reward/code/mean"] == 0.0 and m["reward/code/failures"] == 0
    assert m["accuracy"] == 0.0  # reward=code_tests makes the term the run's accuracy term
    # 2 prompts x 2 completions of noise: no fenced block, so every completion is "no code"
    assert m["reward/code/no_code"] + m["reward/code/compile_errors"] == 4
