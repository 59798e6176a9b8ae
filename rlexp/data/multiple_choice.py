"""The multiple-choice view of a dataset with numeric or short answers (``view=multiple_choice``).

Each record becomes a question with lettered options — its answer and distractors drawn deterministically from
``seed`` and the record's id — whose answer is the letter of the correct option (``scorer: choice``):

    {"question": "<question>\\n\\nOptions:\\nA) 12\\nB) 15\\nC) 9\\nD) 14\\n<instruction>", "answer": "B",
     "scorer": "choice", "metadata": {"options": [...], "letters": "ABCD", "correct": "15", "source": {...}}}

Distractors: for an integer answer, nearby integers (offsets up to max(5, 30 % of |answer|), the negation too); for
a decimal or fraction, the answer scaled by 1 ± {0.1, 0.2, 0.25, 0.5} in the answer's own notation; for any other
short answer, answers of other records of the dataset. ``reshuffle`` gives the same question with the options
moved (every option to another letter) — what the option-shuffle consistency rate re-asks (ACRE).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from fractions import Fraction

from rlexp.data.sources import DatasetSplits

INSTRUCTION = "Answer with the letter of the correct option."
_INT = re.compile(r"^-?\d+$")
_DEC = re.compile(r"^-?\d+\.\d+$")
_FRAC = re.compile(r"^-?\d+/\d+$")


def _rng(seed: int, key: str) -> random.Random:
    return random.Random(int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:16], 16))


def numeric_distractors(answer: str, k: int, rng: random.Random) -> list[str] | None:
    """``k`` distinct wrong options near a numeric ``answer`` (None when the answer is not a number)."""
    a = answer.strip().replace(",", "")
    if _INT.match(a):
        v = int(a)
        span = max(5, round(abs(v) * 0.3))
        pool = {v + d for d in range(-span, span + 1) if d} | ({-v} if v else set())
        return [str(x) for x in rng.sample(sorted(pool), k)]
    if _DEC.match(a) or _FRAC.match(a):
        v = Fraction(a)
        places = len(a.split(".")[1]) if "." in a else None
        out: list[str] = []
        for f in rng.sample([Fraction(s) for s in ("0.1", "0.2", "0.25", "0.5", "-0.1", "-0.2", "-0.25", "-0.5")], 8):
            x = v * (1 + f)
            s = f"{float(x):.{places}f}" if places is not None else str(x)
            if s != a and s not in out:
                out.append(s)
            if len(out) == k:
                return out
        return None  # too few distinct values at this precision (e.g. 0.0): fall back to other answers
    return None


def option_lines(options: list[str], letters: str) -> str:
    """``A) first\nB) second ...``: how the view and GPQA (rlexp.evaluation.sources) list options."""
    return "\n".join(f"{letters[j]}) {o}" for j, o in enumerate(options))


def options_block(options: list[str], letters: str) -> str:
    return "Options:\n" + option_lines(options, letters)


def render(question: str, options: list[str], letters: str) -> str:
    return f"{question}\n\n{options_block(options, letters)}\n{INSTRUCTION}"


def derangement(n: int, rng: random.Random) -> list[int]:
    """A random permutation of range(n) that moves every index (n ≥ 2; n = 1 gives [0])."""
    if n < 2:
        return list(range(n))
    while True:
        order = list(range(n))
        rng.shuffle(order)
        if all(order[j] != j for j in range(n)):
            return order


def reshuffle(record: dict, seed: int = 0) -> tuple[str, list[str]]:
    """The record's question with its options moved to other letters (deterministic in ``seed`` and the id) and the
    new option order. The record must carry ``metadata.options`` (the multiple-choice view, GPQA)."""
    meta = record.get("metadata") or {}
    options, letters = meta.get("options"), meta.get("letters", "ABCD")
    if not options:
        raise ValueError(f"record {record.get('id')!r} has no metadata.options: not a multiple-choice record")
    order = derangement(len(options), _rng(seed, f"reshuffle:{record.get('id')}"))
    moved = [options[j] for j in order]
    lines = option_lines(options, letters)
    if lines not in record["question"]:
        raise ValueError(f"record {record.get('id')!r}: its question does not list its options as 'A) ...' lines")
    return record["question"].replace(lines, option_lines(moved, letters)), moved


@dataclass
class ChoiceView:
    """``view=multiple_choice``: ``ChoiceView(...)(splits)`` turns every record into a lettered multiple-choice
    question. ``num_options`` options (letters A, B, ...); ``seed`` fixes the distractors and the letter order."""

    num_options: int = 4
    seed: int = 0

    def __post_init__(self):
        if not 2 <= self.num_options <= 26:
            raise ValueError(f"view.num_options={self.num_options} must be in [2, 26]")
        self.letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: self.num_options]

    def __call__(self, splits: DatasetSplits) -> DatasetSplits:
        pool = sorted({r["answer"].strip() for r in splits.train + splits.eval})
        return DatasetSplits(
            f"{splits.name}:choice",
            [self.record(r, pool) for r in splits.train],
            [self.record(r, pool) for r in splits.eval],
        )

    def record(self, r: dict, pool: list[str]) -> dict:
        k = self.num_options - 1
        answer = r["answer"].strip()
        rng = _rng(self.seed, str(r["id"]))
        wrong = numeric_distractors(answer, k, rng)
        if wrong is None:
            others = [a for a in pool if a != answer]
            if len(others) < k:
                raise ValueError(
                    f"view=multiple_choice: record {r['id']!r} (answer {answer!r}) needs {k} distractors but the "
                    f"dataset has only {len(others)} other distinct answers; lower view.num_options"
                )
            wrong = rng.sample(others, k)
        options = [answer, *wrong]
        rng.shuffle(options)
        letter = self.letters[options.index(answer)]
        return {
            "id": r["id"],
            "question": render(r["question"], options, self.letters),
            "answer": letter,
            "scorer": "choice",
            "metadata": {
                "options": options,
                "letters": self.letters,
                "correct": answer,
                "source": {"answer": r["answer"], "scorer": r.get("scorer"), "metadata": r.get("metadata")},
            },
        }
