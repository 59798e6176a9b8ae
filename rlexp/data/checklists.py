"""Fact checklists from the base model's own answers — the offline half of KLCF's Dual-Fact Alignment ("Knowledge-Level
Consistency Reinforcement Learning: Dual-Fact Alignment for Long-Form Factuality", Li et al., 2025; arXiv 2509.23765),
the claim and fact rule its rewards share (``split_claims``, ``content_tokens``, ``fact_coverage``, ``claim_overlap``)
and the dataset of long-form prompts that carry checklists.

The paper samples the base model on each query, extracts atomic claims, verifies them (offline, against a local
Wikipedia index) and keeps the supported ones, deduplicated and pruned, as the query's checklist: the facts inside
the base model's knowledge boundary. Ours keeps it external-knowledge-free end to end: a claim is inside the
boundary when it *recurs* — when at least ``min_support`` of the base model's ``k`` sampled answers state it
(self-consistency as the knowledge signal, no retrieval). Claims are sentences (``split_claims``); two claims are
the same fact when the Dice overlap of their content tokens is at least ``match_threshold`` (``claim_overlap``).
Each recurring fact keeps the wording of its first occurrence.

* ``build_checklist(answers, ...)`` — one query's checklist from its sampled answers (pure; unit-tested with
  hand-made answers).
* ``build_checklists(questions, sampler, ...)`` — every query's, sampling through ``sampler(questions, k)`` (any
  callable: ``hf_sampler`` for a local model, a fake one in tests), cached to a jsonl keyed by question and settings.
* ``checklist_dataset(path, ...)`` — the dataset source (``dataset=longfact_checklists``): LongFact-style prompts
  (Wei et al., 2024: a ``prompt`` per row, here with its ``checklist``); with ``build.enabled`` the rows without a
  checklist get one built from the base model (``build.model``) and cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlexp.data.generation import Sampler, lazy_model_sampler
from rlexp.data.sources import DatasetSplits, _split, cell_text, load_table

log = logging.getLogger(__name__)

# What a claim and a fact are, shared with the rewards (rlexp.rewards.factuality): the same rule decides whether two
# sampled answers state one fact (here) and whether a completion covers a checklist fact (there).
STOP_WORDS = frozenset(
    """a an the and or but nor of in on at to for from by with as into onto over under about after before during
    between through than then that this these those there here is are was were be been being am has have had do does
    did it its it's he she they them their his her him we us our you your i me my not no so such also very can could
    would should will shall may might must which who whom whose what when where why how all any each both some many
    much more most other another one s""".split()
)
_WORD = re.compile(r"[^\W_]+")
# sentence ends (., !, ? followed by space), line breaks, and the bullet or number that opens a list item
_CLAIM_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_BULLET = re.compile(r"^\s*(?:[-*•]+|\d+[.)])\s*")


def content_tokens(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``, stop words dropped, a plural ``-s`` cut from words over 4 letters."""
    out = []
    for w in _WORD.findall(text.lower()):
        if w in STOP_WORDS:
            continue
        if len(w) > 4 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


def split_claims(text: str, min_tokens: int = 2) -> list[str]:
    """The claims of a completion: its sentences and list items (bullets stripped) with at least ``min_tokens``
    content tokens, in order."""
    claims = []
    for piece in _CLAIM_BREAK.split(text):
        piece = _BULLET.sub("", piece).strip()
        if piece and len(content_tokens(piece)) >= min_tokens:
            claims.append(piece)
    return claims


def fact_coverage(fact: str | Sequence[str], claim: str | Sequence[str]) -> float:
    """Share of the fact's distinct content tokens found in the claim (token lists or texts); 0 for an empty fact."""
    f = set(content_tokens(fact) if isinstance(fact, str) else fact)
    c = set(content_tokens(claim) if isinstance(claim, str) else claim)
    return len(f & c) / len(f) if f else 0.0


def claim_overlap(a: str | Sequence[str], b: str | Sequence[str]) -> float:
    """Symmetric overlap of two claims: the Dice coefficient of their distinct content tokens (1 = same tokens)."""
    x = set(content_tokens(a) if isinstance(a, str) else a)
    y = set(content_tokens(b) if isinstance(b, str) else b)
    return 2 * len(x & y) / (len(x) + len(y)) if x or y else 0.0


@dataclass
class ChecklistSettings:
    k: int = 8  # answers sampled per question
    min_support: int = 3  # answers that must state a fact for it to enter the checklist
    match_threshold: float = 0.6  # Dice overlap of content tokens at which two claims are the same fact
    max_facts: int = 12  # the most-supported facts kept
    min_claim_tokens: int = 3  # content tokens a sentence needs to count as a claim

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"checklist k={self.k}: must be >= 1")
        if not 1 <= self.min_support <= self.k:
            raise ValueError(f"checklist min_support={self.min_support}: must be in [1, k={self.k}]")
        if not 0.0 < self.match_threshold <= 1.0:
            raise ValueError(f"checklist match_threshold={self.match_threshold}: must be in (0, 1]")
        if self.max_facts < 1 or self.min_claim_tokens < 1:
            raise ValueError(f"checklist max_facts={self.max_facts}, min_claim_tokens={self.min_claim_tokens}: >= 1")

    def key(self, question: str) -> str:
        text = json.dumps([question, self.__dict__], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_checklist(answers: Sequence[str], settings: ChecklistSettings | None = None) -> tuple[list[str], list[int]]:
    """The recurring facts of one question's sampled answers and their support (how many answers state each),
    most supported first (ties: first seen). A fact's wording is its first occurrence; an answer stating a fact
    twice supports it once."""
    s = settings or ChecklistSettings(k=max(len(answers), 1), min_support=1)
    facts: list[tuple[str, list[str], set[int]]] = []  # (wording, its content tokens, answers that state it)
    for j, answer in enumerate(answers):
        for claim in split_claims(answer, s.min_claim_tokens):
            toks = content_tokens(claim)
            best, best_overlap = None, 0.0
            for f in facts:
                o = claim_overlap(toks, f[1])
                if o > best_overlap:
                    best, best_overlap = f, o
            if best is not None and best_overlap >= s.match_threshold:
                best[2].add(j)
            else:
                facts.append((claim, toks, {j}))
    kept = [(i, f) for i, f in enumerate(facts) if len(f[2]) >= s.min_support]
    kept.sort(key=lambda x: (-len(x[1][2]), x[0]))
    kept = kept[: s.max_facts]
    return [f[0] for _, f in kept], [len(f[2]) for _, f in kept]


def read_cache(path: Path) -> dict[str, dict]:
    out = {}
    if path.exists():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    out[row["key"]] = row
                except (json.JSONDecodeError, KeyError) as e:
                    raise ValueError(f"checklist cache {path}: line {n} is not a cache row ({e})") from None
    return out


def build_checklists(
    questions: Sequence[str],
    sampler: Sampler,
    settings: ChecklistSettings | None = None,
    cache: str | Path | None = None,
    model_name: str | None = None,
) -> list[dict]:
    """One row per question — ``{"key", "prompt", "checklist", "support", "k", "model"}`` — built from ``k`` answers
    per question drawn with ``sampler``. With ``cache`` (a jsonl), rows already there for the same question and
    settings are read back instead of sampled, and new rows are appended."""
    s = settings or ChecklistSettings()
    cache_path = Path(cache) if cache is not None else None
    known = read_cache(cache_path) if cache_path is not None else {}
    keys = [s.key(q) for q in questions]
    todo = list(dict.fromkeys(q for q, key in zip(questions, keys) if key not in known))
    if todo:
        answers = sampler(todo, s.k)
        if len(answers) != len(todo) or any(len(a) != s.k for a in answers):
            got = [len(a) for a in answers]
            raise ValueError(f"checklist sampler returned {got} answers for {len(todo)} questions x k={s.k}")
        new = []
        for q, ans in zip(todo, answers):
            facts, support = build_checklist(ans, s)
            new.append(
                {"key": s.key(q), "prompt": q, "checklist": facts, "support": support, "k": s.k, "model": model_name}
            )
        if cache_path is not None:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            with cache_path.open("a") as f:
                for row in new:
                    f.write(json.dumps(row) + "\n")
        known.update({row["key"]: row for row in new})
        log.info("checklists: built %d (k=%d), %d from the cache", len(new), s.k, len(questions) - len(todo))
    return [known[key] for key in keys]


def build_from_model(questions: Sequence[str], build: dict, cache: str | Path | None) -> list[dict]:
    """``build_checklists`` with ``hf_sampler`` over the model that ``build["model"]`` describes (a ``model/`` config
    node, e.g. the run's own ``${model}``) — the dataset source's ``build`` option."""
    opts = dict(build)
    model_cfg = opts.pop("model", None)
    if model_cfg is None:
        raise ValueError("dataset.build.model is not set: the base model's config, e.g. ${model}")
    opts.pop("enabled", None)
    opts.pop("cache", None)
    device = opts.pop("device", "auto")
    sampling = {k: opts.pop(k) for k in ("max_new_tokens", "temperature", "top_p", "seed", "batch_size") if k in opts}
    sampling["system_prompt"] = opts.pop("system_prompt", None)
    try:
        settings = ChecklistSettings(**opts)
    except TypeError as e:
        raise ValueError(f"dataset.build: {e}") from None
    sampler = lazy_model_sampler(model_cfg, device, **sampling)  # loads only when a question is not cached
    return build_checklists(questions, sampler, settings, cache, model_name=sampler.model_name)


def checklist_dataset(
    path: str,
    seed: int,
    name: str | None = None,
    question_column: str = "prompt",
    checklist_column: str = "checklist",
    eval_size: int = 50,
    train_size: int | None = None,
    build: dict | None = None,
) -> DatasetSplits:
    """Long-form prompts with fact checklists (a jsonl/json/parquet/csv file). Each record is
    ``{"id", "question", "answer", "scorer": "checklist", "checklist": [...], "metadata"}``; ``answer`` is the
    checklist joined by "; " (for display: no reward reads it). A row's checklist is its ``checklist_column`` (a list
    of strings); a row without one gets one built from the base model when ``build.enabled`` (``build_from_model``,
    cached to ``build.cache``, default ``<path>.checklists.jsonl``), else is refused naming the row."""
    rows = load_table(path)
    source = f"dataset.path={path}"
    if not rows:
        raise ValueError(f"{source}: no rows")
    questions = []
    for i, r in enumerate(rows):
        if question_column not in r:
            raise ValueError(f"{source}: row {i + 1} has no column {question_column!r} (columns: {sorted(r)})")
        questions.append(cell_text(r, question_column, source, i, numbers=False))
    missing = [i for i, r in enumerate(rows) if r.get(checklist_column) is None]
    built: dict[int, dict] = {}
    if missing:
        if not (build or {}).get("enabled"):
            raise ValueError(
                f"{source}: row {missing[0] + 1} has no {checklist_column!r} ({len(missing)} rows without one): set "
                "dataset.build.enabled=true to build checklists from the base model, or give the column"
            )
        cache = build.get("cache") or f"{path}.checklists.jsonl"
        rows_built = build_from_model([questions[i] for i in missing], build, cache)
        built = dict(zip(missing, rows_built))
    records = []
    for i, (r, q) in enumerate(zip(rows, questions)):
        checklist = built[i]["checklist"] if i in built else r[checklist_column]
        if hasattr(checklist, "tolist") and not isinstance(checklist, str):
            checklist = checklist.tolist()
        if not isinstance(checklist, (list, tuple)) or not all(isinstance(x, str) for x in checklist):
            raise ValueError(f"{source} row {i + 1}: column {checklist_column!r} must be a list of strings")
        records.append(
            {
                "id": f"{Path(path).stem}-{i}",
                "question": q,
                "answer": "; ".join(checklist),
                "scorer": "checklist",
                "checklist": list(checklist),
                "metadata": {
                    "source": source,
                    "row": i + 1,
                    "topic": r.get("topic"),
                    "checklist_built": i in built,
                },
            }
        )
    return _split(name or Path(path).stem, records, eval_size, seed, train_size)
