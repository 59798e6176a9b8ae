"""Paraphrases of a question: the equivalent prompt variants that paraphrase-set methods sample over (Co-Reward's
rephrased question, PS-GRPO's paraphrase sets, information-consistent GRPO's prompt variants).

A source maps (record, k) to the record's k-th paraphrase; k = 0 is the question itself. Two sources:

* ``RecordParaphrases`` — the dataset carries them (``record["paraphrases"]``: a local file's ``paraphrase_columns``,
  e.g. the rewritten column of Co-Reward's rephrased training set beside the original, or a paraphrase set's
  members). This is the source a paper's data uses; a record without enough paraphrases is refused by id.
* ``TemplateParaphrases`` — offline and deterministic: the question reworded by rules (its leading instruction verb
  swapped for a synonym, or the question wrapped in another request), chosen per (record, k) from the seed. It keeps
  the task and the answer exactly and changes only the wording — a surface paraphraser that works with no model and no
  network, standing in where a dataset has none. Co-Reward rewrote its questions with Qwen3-32B; an LLM paraphraser's
  output goes in through ``RecordParaphrases``.
"""

from __future__ import annotations

import hashlib
import re

# instruction verbs at the start of a question and their synonyms (the task is unchanged by the swap)
_VERBS = ("Calculate", "Compute", "Work out", "Evaluate", "Find the value of", "Determine")
_VERB_RE = re.compile(r"^(" + "|".join(re.escape(v) for v in _VERBS) + r")\b\s*", re.IGNORECASE)
_WHAT_IS_RE = re.compile(r"^What is\s+(.*?)\s*\?\s*$", re.IGNORECASE | re.DOTALL)
# requests that wrap any question without changing it
WRAPPERS = (
    "Please answer the following question. {q}",
    "Here is a problem for you: {q}",
    "Question: {q}",
    "I need help with this one. {q}",
    "Consider the task below and solve it.\n{q}",
    "Try this: {q}",
)


def _pick(seed: int, key: str, k: int, n: int) -> int:
    digest = hashlib.sha256(f"{seed}:{key}:{k}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def reworded(question: str) -> list[str]:
    """The rule-based rewordings of ``question`` (never the question itself), verb swaps first."""
    q = question.strip()
    out: list[str] = []
    m = _VERB_RE.match(q)
    body = None
    if m:
        body = q[m.end() :].rstrip(".").strip()
    else:
        w = _WHAT_IS_RE.match(q)
        if w:
            body = w.group(1).strip()
    if body:
        out += [f"{v} {body}." for v in _VERBS if not q.lower().startswith(v.lower())]
        out.append(f"What is {body}?")
    out += [w.format(q=q) for w in WRAPPERS]
    seen, unique = {q}, []
    for text in out:
        if text not in seen:
            seen.add(text)
            unique.append(text)
    return unique


class TemplateParaphrases:
    """Rule-based paraphrases, offline (see the module doc): the k-th of a record (k ≥ 1) is drawn from its
    rewordings by a hash of (seed, record id, k); the K − 1 drawn for a record are distinct."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def __call__(self, record: dict, k: int) -> str:
        question = record["question"]
        if k == 0:
            return question
        options = reworded(question)
        key = str(record.get("id", question))
        order = sorted(range(len(options)), key=lambda j: _pick(self.seed, key, j, 1 << 62))
        return options[order[(k - 1) % len(options)]]


class RecordParaphrases:
    """The dataset's own paraphrases: ``record[field]`` (a list of strings; a single string is one paraphrase)."""

    def __init__(self, field: str = "paraphrases"):
        self.field = field

    def __call__(self, record: dict, k: int) -> str:
        if k == 0:
            return record["question"]
        have = record.get(self.field)
        if isinstance(have, str):
            have = [have]
        if not have or len(have) < k:
            raise ValueError(
                f"record {record.get('id')!r} has {len(have or [])} paraphrase(s) in {self.field!r}, the prompt "
                f"condition asks for variant {k}: give every record enough paraphrases (dataset.paraphrase_columns) "
                "or use the offline source (algorithm.prompt_condition.source=template)"
            )
        return have[k - 1]


SOURCES = {"template": TemplateParaphrases, "record": RecordParaphrases}


def paraphrase_source(name: str, seed: int = 0, field: str = "paraphrases"):
    """The source named by ``algorithm.prompt_condition.source``."""
    if name == "template":
        return TemplateParaphrases(seed)
    if name == "record":
        return RecordParaphrases(field)
    raise ValueError(f"algorithm.prompt_condition.source={name!r} is not one of {sorted(SOURCES)}")
