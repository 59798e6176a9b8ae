"""Code execution as a reward: a completion's program runs against its task's tests in the sandbox.

``CodeTests`` takes the program out of the completion (a fenced code block: the last one, or the last one that
defines the task's entry point; ``rlexp.execution.testcases.extract_code``), completes a HumanEval-style function body
with the record's stub, and runs it against the record's tests (``suite_of``: ``record["tests"]`` or
``metadata.tests`` as a list of MBPP-style assert strings, a HumanEval ``test`` module with ``entry_point``, APPS /
LiveCodeBench ``{inputs, outputs, fn_name}``, or a ready suite) in a sandboxed child per completion
(``rlexp.execution``: ``timeout`` seconds per test, ``memory_mb`` of address space, no network), ``workers`` children
at once. The score is the share of the tests that pass (``partial_credit``; else 1 only when all pass): a program
that does not compile, has no code block, raises on load or runs out of time on every test scores 0.

A record without tests is "does not apply" (``TermResult.missing``: scored 0, counted in ``reward/unscored`` when no
other term scores it); a record whose tests cannot be read is a failure of the term on that sample
(``reward/<term>/failures``). The term's own metrics, logged as ``reward/<term>/<key>`` (``TermResult.metrics``):
``pass_rate`` (mean share of tests passed), ``all_passed_frac``, ``compile_errors``, ``load_errors``, ``timeouts``
(completions with a test over its time limit, or killed at the overall limit), ``no_code``, ``tests_run``,
``seconds`` (wall time of the scoring) and ``throughput`` (completions scored per second).
"""

from __future__ import annotations

import logging
import time

from rlexp.core.registry import REWARDS
from rlexp.execution.testcases import complete_code, extract_code, run_tests_many, suite_of
from rlexp.rewards.terms import RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)


@REWARDS.register
class CodeTests(RewardTerm):
    """Share of the record's tests the completion's program passes in the sandbox (compile errors, timeouts and
    completions scored per second in its metrics)."""

    def __init__(
        self,
        weight: float = 1.0,
        timeout: float = 5.0,
        memory_mb: int = 1024,
        workers: int = 2,
        max_tests: int | None = None,
        max_total: float | None = 30.0,
        partial_credit: bool = True,
        pick: str = "last",
        require_fence: bool = True,
    ):
        super().__init__(weight)
        if timeout <= 0:
            raise ValueError(f"reward term CodeTests.timeout={timeout} must be > 0")
        if int(workers) < 1:
            raise ValueError(f"reward term CodeTests.workers={workers} must be >= 1")
        if max_tests is not None and int(max_tests) < 1:
            raise ValueError(f"reward term CodeTests.max_tests={max_tests} must be >= 1 (or null for all)")
        if max_total is not None and max_total <= 0:
            raise ValueError(f"reward term CodeTests.max_total={max_total} must be > 0 (or null)")
        if pick not in ("first", "last"):
            raise ValueError(f"reward term CodeTests.pick={pick!r} is not one of ('first', 'last')")
        self.timeout, self.memory_mb, self.workers = float(timeout), int(memory_mb), int(workers)
        self.max_tests = int(max_tests) if max_tests is not None else None
        self.max_total = float(max_total) if max_total is not None else None
        self.partial_credit, self.pick, self.require_fence = bool(partial_credit), pick, bool(require_fence)

    def program(self, completion: str, record: dict) -> str | None:
        """The program a completion is run as (``None`` when it has no code)."""
        meta = record.get("metadata") or {}
        entry = record.get("entry_point") or meta.get("entry_point")
        code = extract_code(completion, entry, self.pick, self.require_fence)
        return complete_code(code, meta.get("prompt"), entry) if code is not None else None

    def __call__(self, samples: list[Sample]) -> TermResult:
        t0 = time.perf_counter()
        n = len(samples)
        failures, missing = [False] * n, [False] * n
        jobs, where = [], []
        for i, s in enumerate(samples):
            try:
                suite = suite_of(s.record)
            except ValueError as e:
                log.warning("reward CodeTests: %s", e)
                failures[i] = True
                continue
            if suite is None:
                missing[i] = True
                continue
            jobs.append((self.program(s.completion, s.record), suite))
            where.append(i)
        runs = run_tests_many(jobs, self.timeout, self.memory_mb, self.workers, self.max_tests, self.max_total)
        scores = [0.0] * n
        for i, run in zip(where, runs):
            scores[i] = run.fraction if self.partial_credit else float(run.all_passed)
        seconds = time.perf_counter() - t0
        statuses = [r.status for r in runs]
        k = max(len(runs), 1)
        metrics = {
            "pass_rate": sum(r.fraction for r in runs) / k,
            "all_passed_frac": sum(r.all_passed for r in runs) / k,
            "compile_errors": float(statuses.count("compile_error")),
            "load_errors": float(statuses.count("load_error")),
            "timeouts": float(sum("timeout" in r.cases or r.status == "timeout" for r in runs)),
            "no_code": float(statuses.count("no_code")),
            "tests_run": float(sum(r.total for r in runs if r.status not in ("no_code", "compile_error"))),
            "seconds": seconds,
            "throughput": len(runs) / seconds if seconds > 0 else 0.0,
        }
        return TermResult(scores, failures, missing, metrics)
