"""Final-answer extraction and answer checking.

Formats (``answer_format``):

* ``hash``   – GSM8K style: the text after the last ``####``.
* ``tag``    – ``<answer>…</answer>`` (the last one); DeepSeek-R1 / GRPO-CARE style.
* ``boxed``  – the last ``\\boxed{…}`` (balanced braces).
* ``auto``   – the first of the above that is present.

Each extractor returns ``None`` when the completion states no final answer in that format;
``extract_answer(..., fallback_last_number=True)`` then falls back to the last number in the text
(our choice, used for the accuracy reward so that an unformatted correct answer still scores; the
format reward is what teaches the format).
"""

from __future__ import annotations

import re
from functools import lru_cache

_HASH = re.compile(r"####\s*(.+?)\s*$", re.S)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
ANSWER_FORMATS = ("hash", "tag", "boxed", "auto")


def _clean(ans: str) -> str:
    ans = ans.strip().strip("$").strip()
    return ans.rstrip(".").strip()


def extract_hash(text: str) -> str | None:
    idx = text.rfind("####")
    if idx < 0:
        return None
    ans = text[idx + 4 :].strip().splitlines()
    return _clean(ans[0]) if ans and ans[0].strip() else None


def extract_tag(text: str) -> str | None:
    found = _TAG.findall(text)
    return _clean(found[-1]) if found and found[-1].strip() else None


def extract_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                inner = text[i + 1 : j].strip()
                return inner or None
    return None


EXTRACTORS = {"hash": extract_hash, "tag": extract_tag, "boxed": extract_boxed}


def extract_last_number(text: str) -> str | None:
    nums = _NUMBER.findall(text)
    return nums[-1].replace(",", "") if nums else None


# the prompts' own placeholder for the answer ("End with '#### <answer>'"): a completion that copies it states nothing
# (a label-free vote would otherwise reward the copied placeholder as a consensus answer: Co-Reward on SmolLM2)
PLACEHOLDERS = frozenset({"<answer>", "answer", "<your answer>", "your answer", "..."})


def extract_answer(text: str, answer_format: str = "auto", fallback_last_number: bool = False) -> str | None:
    """The stated final answer in ``answer_format`` (``auto``: hash, tag, boxed in turn); a copied placeholder
    (``PLACEHOLDERS``) is no answer; with ``fallback_last_number`` the last number of the text stands in."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format={answer_format!r} is not one of {ANSWER_FORMATS}")
    names = ("hash", "tag", "boxed") if answer_format == "auto" else (answer_format,)
    for name in names:
        ans = EXTRACTORS[name](text)
        if ans is not None and ans.strip().lower() not in PLACEHOLDERS:
            return ans
    return extract_last_number(text) if fallback_last_number else None


def answer_span(text: str, answer_format: str = "auto") -> tuple[int, int] | None:
    """Character span ``[start, end)`` of the stated final answer (used to split reasoning from
    answer for consistency measurements). ``None`` when no answer in the format is present."""
    names = ("hash", "tag", "boxed") if answer_format == "auto" else (answer_format,)
    for name in names:
        if name == "hash":
            idx = text.rfind("####")
            if idx >= 0 and text[idx + 4 :].strip():
                line = text[idx + 4 :].split("\n")[0]
                s = idx + 4 + (len(line) - len(line.lstrip()))
                return s, idx + 4 + len(line.rstrip())
        elif name == "tag":
            m = list(_TAG.finditer(text))
            if m and m[-1].group(1).strip():
                return m[-1].start(1), m[-1].end(1)
        elif name == "boxed":
            start = text.rfind("\\boxed")
            if start >= 0 and extract_boxed(text) is not None:
                i = text.find("{", start)
                inner = extract_boxed(text)
                return i + 1, i + 1 + len(text[i + 1 :].split(inner, 1)[0]) + len(inner)
    return None


def first_answer(cut: str, continuation: str) -> str:
    """``cut + continuation`` up to the end of the first answer the judge writes at the cut (a judge
    that goes on to state another answer is held to its first one): the rest of the ``####`` line,
    up to the brace closing ``\\boxed{``, or up to ``</answer>``."""
    tail = cut.rstrip()
    if tail.endswith("####"):
        return cut + continuation.split("\n", 1)[0]
    if tail.lower().endswith("<answer>"):
        end = continuation.lower().find("</answer>")
        return cut + (continuation[: end + len("</answer>")] if end >= 0 else continuation)
    if tail.endswith("{"):
        depth = 1
        for j, ch in enumerate(continuation):
            depth += (ch == "{") - (ch == "}")
            if depth == 0:
                return cut + continuation[: j + 1]
    return cut + continuation


_LETTER = re.compile(r"^[\s({\[]*(?:\\text(?:bf)?\{)?\s*\(?([A-Z])\)?(?:\}|\b|$)")


def choice_letter(ans: str | None, letters: str = "ABCD", options: list[str] | None = None) -> str | None:
    """A stated multiple-choice answer reduced to its letter: ``C``, ``(C)``, ``C) 42``, ``\\text{(C)}`` all give
    ``C``. With ``options`` (the record's, in letter order) an answer that states an option's content instead
    (``42``; math-equivalent for numbers, else equal up to case and spaces) gives that option's letter — a small
    model often answers with the value. None when neither matches."""
    if ans is None:
        return None
    m = _LETTER.match(ans.strip())
    if m and m.group(1) in letters:
        return m.group(1)
    if options:
        norm = " ".join(ans.strip().casefold().split())
        for j, o in enumerate(options[: len(letters)]):
            if norm == " ".join(str(o).strip().casefold().split()) or math_equal(ans, str(o)):
                return letters[j]
    return None


def normalize_number(ans: str) -> str:
    return ans.replace(",", "").replace(" ", "").rstrip(".")


@lru_cache(maxsize=65536)
def math_equal(pred: str, gold: str) -> bool:
    """Equivalence of two math answers through math-verify (LaTeX, fractions, ``\\boxed{}``), with
    an exact-string fast path. math-verify's own timeout uses signals; we disable it (it only works
    in the main thread) and rely on short inputs."""
    if pred is None or gold is None:
        return False
    if normalize_number(pred) == normalize_number(gold):
        return True
    from math_verify import parse, verify

    try:
        g = parse(_as_latex(gold), parsing_timeout=None)
        p = parse(_as_latex(pred), parsing_timeout=None)
        return bool(g and p and verify(g, p, timeout_seconds=None))
    except Exception:  # unparsable answers are simply wrong
        return False


def _as_latex(ans: str) -> str:
    ans = ans.strip()
    return ans if ans.startswith("$") or "\\boxed" in ans else f"${ans}$"
