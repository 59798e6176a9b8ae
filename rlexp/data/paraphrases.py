"""Paraphrases of a question: the equivalent prompt variants that paraphrase-set methods sample over (Co-Reward's
rephrased question, PS-GRPO's paraphrase sets, information-consistent GRPO's prompt variants).

A source maps (record, k) to the record's k-th paraphrase; k = 0 is the question itself. Two sources:

* ``RecordParaphrases`` — the dataset carries them (``record["paraphrases"]``: a local file's ``paraphrase_columns``,
  e.g. the rewritten column of Co-Reward's rephrased training set beside the original, or a paraphrase set's
  members). This is the source a paper's data uses; a record without enough paraphrases is refused by id.
* ``TemplateParaphrases`` — offline and deterministic: the question reworded by rules (its leading instruction verb
  swapped for a synonym, or the question wrapped in another request), chosen per (record, k) from the seed. It keeps
  the task and the answer exactly and changes only the wording — a surface paraphraser that works with no model and no
  network, standing in where a dataset has none.
* ``ModelParaphrases`` — an LLM rewrites the question, as Co-Reward built its rephrased set (Qwen3-32B, temperature
  0.7, top-p 0.8, an instruction to keep the mathematics and the answer and change the wording and the scenario, the
  rewrite read between markers). Each (question, k) is rewritten once and cached to a jsonl; a reply without a usable
  rewrite (no marker, empty, the question itself, or — ``keep_numbers`` — a number of the question missing) falls
  back to the template paraphrase and is counted (``fallbacks``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

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


# the rewriting request (Co-Reward's recipe in our words); the reply's rewrite is read after the REWRITE marker
REWRITE_INSTRUCTION = (
    "Rewrite the problem below in different words and, where it fits, a different everyday setting. Keep its "
    "mathematics, every number and its answer exactly the same; do not solve it. Reply in exactly this form:\n"
    "REWRITE:\n<the rewritten problem>\nEND\n\nProblem:\n{question}"
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_rewrite(reply: str, question: str, keep_numbers: bool = True) -> str | None:
    """The rewrite in a model's reply (after ``REWRITE:``, up to ``END``), or None when it is missing, empty, the
    question itself, or (``keep_numbers``) drops a number the question states."""
    at = reply.find("REWRITE:")
    if at < 0:
        return None
    text = reply[at + len("REWRITE:") :]
    end = text.find("END")
    text = (text if end < 0 else text[:end]).strip()
    if not text or text == question.strip():
        return None
    if keep_numbers and not set(_NUMBER.findall(question)) <= set(_NUMBER.findall(text)):
        return None
    return text


class ModelParaphrases:
    """LLM rewrites of each question, cached (see the module doc). ``model``: a ``model/`` config node (loaded at
    the first question not in the cache) or ``sampler``: any ``(texts, k) -> k replies per text`` callable;
    ``cache``: a jsonl path (null: in memory only)."""

    def __init__(
        self,
        model=None,
        cache: str | None = None,
        seed: int = 0,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.8,
        keep_numbers: bool = True,
        instruction: str = REWRITE_INSTRUCTION,
        sampler=None,
    ):
        if sampler is None and model is None:
            raise ValueError("algorithm.prompt_condition.model is not set: the rewriting model's config, e.g. ${model}")
        if "{question}" not in instruction:
            raise ValueError("algorithm.prompt_condition.instruction must contain '{question}'")
        if sampler is None:
            from rlexp.data.generation import lazy_model_sampler

            sampler = lazy_model_sampler(
                model, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
            )
        self.sampler, self.keep_numbers, self.instruction = sampler, keep_numbers, instruction
        self.fallback = TemplateParaphrases(seed)
        self.cache_path = Path(cache) if cache else None
        self.rewrites: dict[tuple[str, int], str] = {}
        self.fallbacks = 0
        if self.cache_path is not None and self.cache_path.exists():
            for line in self.cache_path.read_text().splitlines():
                row = json.loads(line)
                self.rewrites[(row["question"], int(row["k"]))] = row["rewrite"]

    def prepare(self, records: list[dict], ks: list[int]) -> None:
        """Rewrite, in one batch, every (record, k ≥ 1) not in the cache yet."""
        todo = list(dict.fromkeys((r["question"], k) for r in records for k in ks if k > 0))
        todo = [(q, k) for q, k in todo if (q, k) not in self.rewrites]
        if not todo:
            return
        questions = list(dict.fromkeys(q for q, _ in todo))
        need = max(k for _, k in todo)
        replies = self.sampler([self.instruction.format(question=q) for q in questions], need)
        rows = []
        for q, got in zip(questions, replies):
            for k in range(1, need + 1):
                if (q, k) in self.rewrites:
                    continue
                text = parse_rewrite(got[k - 1], q, self.keep_numbers)
                fell_back = text is None
                if fell_back:
                    self.fallbacks += 1
                    text = self.fallback({"id": q, "question": q}, k)
                self.rewrites[(q, k)] = text
                rows.append({"question": q, "k": k, "rewrite": text, "fallback": fell_back})
        if self.cache_path is not None:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
        log.info("paraphrases: %d rewritten, %d fell back to the template source", len(rows), self.fallbacks)

    def __call__(self, record: dict, k: int) -> str:
        if k == 0:
            return record["question"]
        if (record["question"], k) not in self.rewrites:
            self.prepare([record], [k])
        return self.rewrites[(record["question"], k)]


SOURCES = {"template": TemplateParaphrases, "record": RecordParaphrases, "model": ModelParaphrases}


def paraphrase_source(name: str, seed: int = 0, field: str = "paraphrases", **model_settings):
    """The source named by ``algorithm.prompt_condition.source`` (``model_settings``: ``ModelParaphrases``')."""
    if name == "template":
        return TemplateParaphrases(seed)
    if name == "record":
        return RecordParaphrases(field)
    if name == "model":
        return ModelParaphrases(seed=seed, **model_settings)
    raise ValueError(f"algorithm.prompt_condition.source={name!r} is not one of {sorted(SOURCES)}")
