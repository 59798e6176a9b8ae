"""A program checked against a task's tests in the sandbox, with a result per test.

A test suite is a JSON-able dict of one of three kinds:

* ``{"kind": "asserts", "cases": [src, ...], "setup": src}`` — MBPP-style: the program runs, then ``setup`` (test
  imports, MBPP's ``test_setup_code``, a HumanEval test module), then each case (an ``assert`` statement or any
  snippet; an ``AssertionError`` fails it) in the program's namespace.
* ``{"kind": "stdio", "cases": [{"input": str, "output": str}, ...]}`` — competitive programming (APPS,
  LiveCodeBench, Codeforces): the program runs once per case with the input on its standard input; its standard
  output must match the expected one line by line after stripping, numbers compared as decimals (LiveCodeBench's
  rule: ``1.0`` matches ``1``).
* ``{"kind": "call", "fn_name": str, "cases": [{"args": [...], "expected": value}, ...], "lenient": bool}`` —
  call-based (LeetCode problems of LiveCodeBench, APPS with ``fn_name``): the function (or ``Solution().fn_name``)
  is called with each case's arguments; the result must equal the expected value (tuples compared as lists;
  ``lenient``: an expected ``[x]`` also accepts ``x``, as APPS's own checker does). ``prelude`` (imports LeetCode
  provides: ``typing``, ``collections``, ...) runs before the program.

``normalize_tests`` turns the shapes records carry into a suite (a list of assert strings, a HumanEval
``test`` + ``entry_point``, APPS/LiveCodeBench ``{"inputs", "outputs", "fn_name"}``, Skywork-OR1's ``{"assert_case"}``
and pytest-style ``{"test_code", "entry_point", "import_prefix"}``, a JSON string of those);
``suite_of(record)`` finds them in a record (``record["tests"]``, ``record["metadata"]["tests"]``, or
``metadata.test`` + ``metadata.entry_point``). A HumanEval ``check(candidate)`` whose body is only ``assert``
statements is split into one case per assertion, so that partial credit is possible.

``run_tests`` runs one program in one sandboxed child (``execution.sandbox``): it compiles (a syntax error is
``compile_error``, found in the parent without starting a child), runs the program (an exception there is
``load_error``), then every case under its own time limit (a ``SIGALRM`` timer: a case that runs over is a
``timeout`` and the next case still runs). The child reports each case as it finishes, so a child killed at the
overall wall-clock limit (or by the memory limit) still yields the cases before it.
"""

from __future__ import annotations

import ast
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rlexp.execution.sandbox import NO_NETWORK, run_child

KINDS = ("asserts", "stdio", "call")

# imports LeetCode's judge provides to call-based solutions (typing's List, collections' deque, ...), as the
# LiveCodeBench harness prepends them; builtins last, so that math's pow does not shadow the builtin
CALL_PRELUDE = (
    "from typing import *\nfrom collections import *\nfrom heapq import *\nfrom bisect import *\n"
    "from itertools import *\nfrom functools import *\nfrom math import *\nfrom string import *\n"
    "import collections, heapq, bisect, itertools, functools, math, string, re, random, sys, copy, json\n"
    "from builtins import *\n"
)

# the child: reads {"code", "suite", "timeout"} from stdin, reports one JSON line per event on the original stdout
_HARNESS = (
    NO_NETWORK
    + r"""
import copy, io, json, os, signal, socket, sys
from decimal import Decimal, InvalidOperation

_P = json.loads(sys.stdin.buffer.read().decode("utf-8"))
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
_NULL_W = os.open(os.devnull, os.O_WRONLY)
_NULL_R = os.open(os.devnull, os.O_RDONLY)
os.dup2(_NULL_W, 1)
os.dup2(_NULL_R, 0)
sys.stdin = open(0, "r", closefd=False)

def _emit(**kw):
    _OUT.write(json.dumps(kw) + "\n")
    _OUT.flush()

class _Timeout(BaseException):
    pass

def _on_alarm(signum, frame):
    raise _Timeout()

signal.signal(signal.SIGALRM, _on_alarm)
_T = float(_P["timeout"])

def _guarded(fn):
    signal.setitimer(signal.ITIMER_REAL, _T)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

def _why(e):
    return (type(e).__name__ + ": " + str(e))[:300]

def _lines(s):
    return [l.strip() for l in s.strip().split("\n")]

def _same_output(got, want):
    g, w = _lines(got), _lines(want)
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        if a == b or a.split() == b.split():
            continue
        try:
            if [Decimal(x) for x in a.split()] != [Decimal(x) for x in b.split()]:
                return False
        except (InvalidOperation, ValueError):
            return False
    return True

def _plain(x):
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x

_S = _P["suite"]
_kind = _S["kind"]
try:
    _code = compile(_P["code"], "<solution>", "exec")
except BaseException as e:
    _emit(event="compile", detail=_why(e))
    sys.exit(0)

def _load(ns):
    if _S.get("prelude"):
        exec(_S["prelude"], ns)
    _guarded(lambda: exec(_code, ns))
    if _S.get("setup"):
        _guarded(lambda: exec(compile(_S["setup"], "<setup>", "exec"), ns))

if _kind == "stdio":
    for i, case in enumerate(_S["cases"]):
        with open("input.txt", "w") as f:
            f.write(case["input"])
        fd = os.open("input.txt", os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        fd = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.close(fd)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        status, detail = "passed", ""
        ns = {"__name__": "__main__"}
        try:
            if _S.get("prelude"):
                exec(_S["prelude"], ns)
            _guarded(lambda: exec(_code, ns))
        except SystemExit as e:
            if e.code not in (None, 0):
                status, detail = "error", "exit status %r" % (e.code,)
        except _Timeout:
            status, detail = "timeout", "time limit %ss" % _T
        except BaseException as e:
            status, detail = "error", _why(e)
        finally:
            try:
                sys.stdout.flush()
            except BaseException:
                pass
            os.dup2(_NULL_W, 1)
            os.dup2(_NULL_R, 0)
            sys.stdout, sys.stdin = sys.__stdout__, open(0, "r", closefd=False)
        if status == "passed":
            with open("output.txt", errors="replace") as f:
                got = f.read()
            if not _same_output(got, case["output"]):
                status, detail = "failed", "wrong output %r" % got[:100]
        _emit(event="case", i=i, status=status, detail=detail)
else:
    ns = {"__name__": "__main__"}
    try:
        _load(ns)
        fn = None
        if _kind == "call":
            sol = ns.get("Solution")
            if isinstance(sol, type) and hasattr(sol, _S["fn_name"]):
                fn = getattr(_guarded(sol), _S["fn_name"])
            else:
                fn = ns.get(_S["fn_name"])
            if not callable(fn):
                raise NameError("the program defines no function %r" % _S["fn_name"])
    except _Timeout:
        _emit(event="load", status="timeout", detail="time limit %ss" % _T)
        sys.exit(0)
    except BaseException as e:
        _emit(event="load", status="error", detail=_why(e))
        sys.exit(0)
    for i, case in enumerate(_S["cases"]):
        status, detail = "passed", ""
        try:
            if _kind == "asserts":
                _guarded(lambda: exec(compile(case, "<test %d>" % i, "exec"), ns))
            else:
                args = copy.deepcopy(case["args"])
                got = _plain(_guarded(lambda: fn(*args)))
                want = case["expected"]
                lenient = _S.get("lenient") and isinstance(want, list) and len(want) == 1 and got == want[0]
                if got != want and not lenient:
                    status, detail = "failed", "returned %r" % (got,)
        except AssertionError as e:
            status, detail = "failed", _why(e)
        except _Timeout:
            status, detail = "timeout", "time limit %ss" % _T
        except BaseException as e:
            status, detail = "error", _why(e)
        _emit(event="case", i=i, status=status, detail=detail[:300])
_emit(event="done")
"""
)


@dataclass
class TestRun:
    """The outcome of one program on one suite. ``status``: ``passed`` (every case), ``failed`` (some case failed or
    raised), ``timeout`` (some case ran over its limit, or the child was killed at the overall limit),
    ``compile_error``, ``load_error`` (the program, or the suite's setup, raised), ``no_code`` or ``no_tests``."""

    __test__ = False  # not a pytest class

    status: str
    total: int
    passed: int = 0
    cases: list[str] = field(default_factory=list)  # per case: passed | failed | error | timeout
    detail: str = ""
    seconds: float = 0.0

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def describe(self) -> str:
        if self.status == "passed":
            return "passed"
        return f"{self.status} ({self.passed}/{self.total} tests): {self.detail}".rstrip(": ")


def check_suite(suite: dict, where: str = "tests") -> dict:
    """``suite`` if it is a well-formed suite (see module docstring), else a ``ValueError`` naming ``where``."""
    if not isinstance(suite, dict) or suite.get("kind") not in KINDS:
        raise ValueError(f"{where}: a test suite needs kind in {KINDS}, got {str(suite)[:120]!r}")
    cases = suite.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"{where}: the {suite['kind']} suite has no cases")
    kind = suite["kind"]
    for j, c in enumerate(cases):
        ok = (
            isinstance(c, str) and c.strip()
            if kind == "asserts"
            else isinstance(c, dict) and {"input", "output"} <= set(c)
            if kind == "stdio"
            else isinstance(c, dict) and isinstance(c.get("args"), list) and "expected" in c
        )
        if not ok:
            raise ValueError(f"{where}: case {j + 1} of the {kind} suite is malformed: {str(c)[:120]!r}")
    if kind == "call" and not suite.get("fn_name"):
        raise ValueError(f"{where}: a call suite needs fn_name")
    return suite


def humaneval_suite(test: str, entry_point: str) -> dict:
    """A HumanEval-style ``test`` module (``def check(candidate): ...``) for the function ``entry_point``: one case
    per ``assert`` when ``check``'s body is only assertions (``candidate`` bound to the entry point), else the single
    case ``check(entry_point)`` (EvalPlus's loops over inputs)."""
    body = None
    try:
        for node in ast.parse(test).body:
            if isinstance(node, ast.FunctionDef) and node.name == "check":
                body = [
                    s
                    for s in node.body
                    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))  # docstrings
                ]
    except SyntaxError:
        body = None
    if body and all(isinstance(s, ast.Assert) for s in body):
        return {
            "kind": "asserts",
            "setup": f"{test}\n\ncandidate = {entry_point}\n",
            "cases": [ast.unparse(s) for s in body],
        }
    return {"kind": "asserts", "setup": test, "cases": [f"check({entry_point})"]}


def pytest_suite(test_code: str, entry_point: str | None = None) -> dict:
    """A pytest-style test module (``from solution import f`` then ``def test_...(): assert ...``): the imports of the
    solution module dropped (the program's namespace is the solution), one case per top-level ``test_*`` function;
    a module with ``check(candidate)`` and an entry point is HumanEval-style; anything else runs as one case."""
    try:
        tree = ast.parse(test_code)
    except SyntaxError as e:
        raise ValueError(f"the test module does not parse ({e})") from e
    if entry_point and any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
        return humaneval_suite(test_code, entry_point)
    keep = [
        n for n in tree.body if not (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "solution")
    ]
    names = [n.name for n in keep if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    setup = ast.unparse(ast.Module(body=keep, type_ignores=[]))
    if not names:
        return {"kind": "asserts", "setup": "", "cases": [setup]}
    return {"kind": "asserts", "setup": setup, "cases": [f"{n}()" for n in names]}


def _with_prelude(suite: dict, prefix: str) -> dict:
    if prefix.strip():
        suite["prelude"] = (prefix.rstrip() + "\n" + suite.get("prelude", "")).rstrip() + "\n"
    return suite


def _io_value(x):
    return "\n".join(map(str, x)) if isinstance(x, list) else str(x)


def _inputs_outputs_suite(d: dict) -> dict:
    inputs, outputs = d.get("inputs"), d.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError("inputs and outputs must be lists of the same length")
    if d.get("fn_name"):
        cases = []
        for inp, out in zip(inputs, outputs):
            if isinstance(inp, str):  # LiveCodeBench functional: one JSON value per line
                args = [json.loads(line) for line in inp.split("\n") if line.strip()]
            else:
                args = list(inp)
            if isinstance(out, str):
                try:
                    out = json.loads(out)
                except json.JSONDecodeError:
                    pass
            cases.append({"args": args, "expected": out})
        lenient = any(not isinstance(i, str) for i in inputs)  # APPS call-based: expected values wrapped in a list
        return {"kind": "call", "fn_name": d["fn_name"], "cases": cases, "lenient": lenient, "prelude": CALL_PRELUDE}
    return {
        "kind": "stdio",
        "cases": [{"input": _io_value(i), "output": _io_value(o)} for i, o in zip(inputs, outputs)],
    }


_ASSERT_LINE = re.compile(r"^\s*assert\b")


def normalize_tests(raw, entry_point: str | None = None, where: str = "tests") -> dict | None:
    """A suite from the shapes records carry (module docstring); ``None`` for no tests. Errors name ``where``."""
    if raw is None:
        return None
    if hasattr(raw, "tolist") and not isinstance(raw, str):  # a numpy array from a parquet column
        raw = raw.tolist()
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return None
        if text[0] in "[{":
            try:
                return normalize_tests(json.loads(text), entry_point, where)
            except json.JSONDecodeError:
                pass
        if entry_point and re.search(r"^def\s+check\s*\(", text, re.M):
            return check_suite(humaneval_suite(text, entry_point), where)
        lines = [l for l in text.splitlines() if l.strip()]
        if all(_ASSERT_LINE.match(l) for l in lines):  # one assert per line: one case each
            return check_suite({"kind": "asserts", "setup": "", "cases": lines}, where)
        return check_suite({"kind": "asserts", "setup": "", "cases": [text]}, where)
    if isinstance(raw, (list, tuple)):
        items = list(raw)
        if items and all(isinstance(x, str) for x in items):
            return check_suite({"kind": "asserts", "setup": "", "cases": items}, where)
        if items and all(isinstance(x, dict) and {"input", "output"} <= set(x) for x in items):
            return check_suite(
                {"kind": "stdio", "cases": [dict(input=x["input"], output=x["output"]) for x in items]}, where
            )
        raise ValueError(f"{where}: a list of tests must hold assert strings or {{input, output}} pairs")
    if isinstance(raw, dict):
        if "kind" in raw:
            return check_suite(dict(raw), where)
        entry = raw.get("entry_point") or entry_point
        prefix = str(raw.get("import_prefix") or "")
        if "test" in raw and entry:
            return check_suite(_with_prelude(humaneval_suite(raw["test"], entry), prefix), where)
        if "test_code" in raw:  # pytest-style module (KodCode / Skywork-OR1): one case per test_* function
            return check_suite(_with_prelude(pytest_suite(str(raw["test_code"]), entry), prefix), where)
        if "assert_case" in raw:  # Skywork-OR1 / DeepCoder asserts
            suite = normalize_tests(list(raw["assert_case"]), entry, where)
            return _with_prelude(suite, prefix) if suite is not None else None
        if "inputs" in raw or "outputs" in raw:
            try:
                return check_suite(_inputs_outputs_suite(raw), where)
            except (ValueError, TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"{where}: {e}") from e
        for key in ("asserts", "test_list"):
            if key in raw:
                suite = normalize_tests(raw[key], entry, where)
                if suite is not None and raw.get("setup"):
                    suite["setup"] = raw["setup"]
                return suite
    raise ValueError(f"{where}: unrecognised tests {str(raw)[:120]!r}")


def suite_of(record: dict) -> dict | None:
    """The test suite of a record: ``record["tests"]``, ``record["metadata"]["tests"]``, or a HumanEval-style
    ``metadata.test`` with ``metadata.entry_point``; ``None`` when it has none."""
    meta = record.get("metadata") or {}
    entry = record.get("entry_point") or meta.get("entry_point")
    raw = record.get("tests", meta.get("tests"))
    if raw is None and meta.get("test") and entry:
        raw = {"test": meta["test"], "entry_point": entry}
    suite = normalize_tests(raw, entry, where=f"record {record.get('id')!r} tests")
    setup = meta.get("test_setup_code")  # MBPP's, kept in the metadata by a training set's mapping
    if suite is not None and suite["kind"] == "asserts" and isinstance(setup, str) and setup.strip():
        if setup not in (suite.get("setup") or ""):
            suite["setup"] = setup.rstrip() + "\n" + (suite.get("setup") or "")
    return suite


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = ("", "python", "py", "python3", "Python", "Python3")


def extract_code(text: str, entry_point: str | None = None, pick: str = "last", require_fence: bool = True):
    """The program in a completion: among its fenced code blocks (untagged or tagged Python), the last (``pick:
    last``, where a reasoning model puts its final answer) or first one that defines ``entry_point`` when given, else
    the last/first block; without a block, ``None`` (``require_fence``) or the whole text."""
    if pick not in ("first", "last"):
        raise ValueError(f"pick={pick!r} is not one of ('first', 'last')")
    blocks = [body for tag, body in _FENCE.findall(text or "") if tag in _PYTHON_TAGS and body.strip()]
    if pick == "last":
        blocks = blocks[::-1]
    if entry_point:
        for b in blocks:
            if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", b, re.M):
                return b
    if blocks:
        return blocks[0]
    if require_fence or not (text or "").strip():
        return None
    return text


def complete_code(code: str, prompt: str | None, entry_point: str | None) -> str:
    """HumanEval-style completion: a program that does not define ``entry_point`` at top level continues ``prompt``
    (the function's stub); one that does stands alone after the prompt's imports."""
    if not prompt or not entry_point:
        return code
    if re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return prompt.rstrip() + "\n    pass\n\n" + code
    return prompt + code


def _compiles(code: str) -> str | None:
    try:
        compile(code, "<solution>", "exec")
        return None
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
        return f"{type(e).__name__}: {e}"[:300]


def run_tests(
    code: str | None,
    suite: dict | None,
    timeout: float = 5.0,
    memory_mb: int = 1024,
    max_tests: int | None = None,
    max_total: float | None = None,
) -> TestRun:
    """Run ``code`` against ``suite`` in one sandboxed child: ``timeout`` seconds per case (and for loading the
    program), the first ``max_tests`` cases (``None``: all), at most ``max_total`` seconds in all (``None``: the sum
    of the per-case limits plus one for loading)."""
    t0 = time.perf_counter()
    if suite is None:
        return TestRun("no_tests", 0, detail="the record has no tests")
    cases = suite["cases"][:max_tests] if max_tests else suite["cases"]
    n = len(cases)
    if code is None or not code.strip():
        return TestRun("no_code", n, 0, ["error"] * n, "no code in the completion")
    why = _compiles(code)
    if why is not None:
        return TestRun("compile_error", n, 0, ["error"] * n, why, time.perf_counter() - t0)
    limit = timeout * (n + 1) + 1.0
    if max_total is not None:
        limit = max(min(limit, max_total), timeout + 1.0)
    payload = json.dumps({"code": code, "suite": {**suite, "cases": cases}, "timeout": timeout}).encode()
    res = run_child(_HARNESS, payload, limit, memory_mb, capture_stdout=True)
    statuses: list[str | None] = [None] * n
    detail, load = "", None
    for line in res.stdout.decode(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("event") == "case" and 0 <= ev.get("i", -1) < n:
            statuses[ev["i"]] = ev["status"]
            if ev["status"] != "passed" and not detail:
                detail = f"test {ev['i'] + 1}: {ev.get('detail', '')}"
        elif ev.get("event") == "compile":
            return TestRun("compile_error", n, 0, ["error"] * n, ev.get("detail", ""), time.perf_counter() - t0)
        elif ev.get("event") == "load":
            load = ev
    seconds = time.perf_counter() - t0
    if load is not None:
        status = "timeout" if load.get("status") == "timeout" else "load_error"
        return TestRun(status, n, 0, [load.get("status", "error")] * n, load.get("detail", ""), seconds)
    killed = res.timed_out or any(s is None for s in statuses)
    if killed and not detail:
        err = [l for l in res.stderr.decode(errors="replace").splitlines() if l.strip()]
        detail = (
            f"killed at the wall-clock limit {limit:.0f}s"
            if res.returncode is None
            else (err[-1][:300] if err else f"the child exited with status {res.returncode}")
        )
    missing = "timeout" if res.timed_out else "error"
    cases_out = [s if s is not None else missing for s in statuses]
    passed = sum(s == "passed" for s in cases_out)
    if passed == n:
        status = "passed"
    elif "timeout" in cases_out:
        status = "timeout"
    else:
        status = "failed"
    return TestRun(status, n, passed, cases_out, detail, seconds)


def run_tests_many(
    jobs: list[tuple[str | None, dict | None]],
    timeout: float = 5.0,
    memory_mb: int = 1024,
    workers: int = 2,
    max_tests: int | None = None,
    max_total: float | None = None,
) -> list[TestRun]:
    """``run_tests`` over ``(code, suite)`` pairs, ``workers`` children at a time (order preserved)."""
    if not jobs:
        return []
    go = lambda job: run_tests(job[0], job[1], timeout, memory_mb, max_tests, max_total)  # noqa: E731
    if workers <= 1 or len(jobs) == 1:
        return [go(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(go, jobs))
