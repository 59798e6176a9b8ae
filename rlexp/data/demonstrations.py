"""Demonstrations: a reference solution per record, written as a completion in the prompt's answer format, for the
SFT–RL hybrids (LUFFY's off-policy rows, CHORD's expert rows, GHPO's hints, the SFT stage).

Where a record's solution comes from, first found wins:

1. ``record["demonstration"]``: a dataset column (``dataset=local dataset.demonstration_column=...``; any source
   that sets it), used as written (its own answer line included, if it has one);
2. ``metadata["answer_cot"]``: reasoning-gym's worked solution (``gsm_symbolic`` and other tasks that ship one);
3. ``metadata["solution"]``: GSM8K's and MATH's reference solution (its ``#### 72`` or ``\\boxed{72}`` answer is
   stripped and written again in the prompt's format);
4. ``metadata["expression"]``: reasoning-gym's arithmetic tasks (``basic_arithmetic``, ``chain_sum``): the one-line
   working ``<expression> = <answer>``, which is the task's own solution.

A record with none of them has no demonstration (``None``); the parts that need one count such rows and leave
them to plain RL, never fail. The reasoning is followed by the record's gold answer in the answer format
(``hash``: a last line ``#### <answer>``; ``tag``: ``<think>…</think><answer>…</answer>``; ``boxed``:
``\\boxed{<answer>}``)."""

from __future__ import annotations

import re

_HASH_LINE = re.compile(r"\n?\s*####[^\n]*\s*$")
_BOXED_TAIL = re.compile(r"\\boxed\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}\s*\.?\s*$")
_GSM8K_CALC = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: "3*4=<<3*4=12>>12"


def reasoning(record: dict) -> str | None:
    """The record's worked solution without its final answer line, or None when it has none."""
    meta = record.get("metadata") or {}
    for key in ("answer_cot", "solution"):
        text = meta.get(key)
        if isinstance(text, str) and text.strip():
            text = _GSM8K_CALC.sub("", text)
            text = _HASH_LINE.sub("", text.rstrip())
            text = _BOXED_TAIL.sub("", text.rstrip()).rstrip()
            return text.strip() or None
    expression = meta.get("expression")
    if isinstance(expression, str) and expression.strip():
        return f"{expression.strip()} = {record['answer']}"
    return None


def formatted(reasoning_text: str, answer: str, answer_format: str) -> str:
    """``reasoning_text`` followed by ``answer`` in ``answer_format`` (hash, tag or boxed; auto writes hash)."""
    if answer_format == "tag":
        return f"<think>{reasoning_text}</think><answer>{answer}</answer>"
    if answer_format == "boxed":
        return f"{reasoning_text}\nThe answer is \\boxed{{{answer}}}."
    if answer_format in ("hash", "auto"):
        return f"{reasoning_text}\n#### {answer}"
    raise ValueError(f"answer_format={answer_format!r}: a demonstration is written in hash, tag or boxed")


def demonstration(record: dict, answer_format: str) -> str | None:
    """The record's demonstration as a completion in ``answer_format``, or None when the record has no solution."""
    given = record.get("demonstration")
    if isinstance(given, str) and given.strip():
        return given
    text = reasoning(record)
    if text is None:
        return None
    return formatted(text, str(record["answer"]), answer_format)


def prefix(text: str, fraction: float) -> str:
    """The first ``fraction`` of the demonstration's reasoning, cut at a word boundary (GHPO's hint: a share of the
    reference solution). 0 gives the empty string, 1 the whole reasoning."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"hint fraction {fraction} must be in [0, 1]")
    words = text.split()
    n = round(len(words) * fraction)
    return " ".join(words[:n])
