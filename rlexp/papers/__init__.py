"""The paper registry (``registry.yaml`` beside this file): every grade-A catalogue paper and the paper of every
shipped method config, with its status on this platform.

``load_papers`` validates the file and returns :class:`Paper` records; ``format_papers`` and ``papers_json`` are
the table and JSON views of ``rlexp list papers [--json] [--status S] [--family F]`` (``main``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from rlexp.algorithms.families import FAMILIES
from rlexp.config.paths import CONF_DIR

REGISTRY = Path(__file__).with_name("registry.yaml")
STATUSES: tuple[str, ...] = ("implemented", "partial", "planned", "out of scope")
KEYS: tuple[str, ...] = ("id", "title", "year", "arxiv", "catalogue", "family", "status", "note", "issue", "configs")

_REF = r"[A-Za-z0-9_]+ #\d+"
_CATALOGUE = re.compile(rf"{_REF}(?:; {_REF})*")
_ARXIV = re.compile(r"\d{4}\.\d{4,5}")
_CONFIG = re.compile(r"[A-Za-z0-9_]+/[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Paper:
    """One registry entry; ``catalogue`` holds one or more ``"catalog_N #row"`` refs joined by ``"; "``."""

    id: str
    title: str
    year: int | None
    arxiv: str | None
    catalogue: str | None
    family: str
    status: str
    note: str | None
    issue: int | None
    configs: tuple[str, ...]

    @property
    def refs(self) -> tuple[str, ...]:
        """The catalogue rows of this paper (empty for papers no catalogue lists)."""
        return tuple(self.catalogue.split("; ")) if self.catalogue else ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["configs"] = list(self.configs)
        return data


def _fail(where: str, key: str, problem: str) -> ValueError:
    return ValueError(f"paper registry: entry {where}, key {key!r}: {problem}")


def _validate(raw: Any, index: int, conf_dir: Path) -> Paper:
    if not isinstance(raw, dict):
        raise ValueError(f"paper registry: entry #{index} is not a mapping")
    ident = raw.get("id")
    where = repr(ident) if isinstance(ident, str) and ident else f"#{index}"
    for key in KEYS:
        if key not in raw:
            raise _fail(where, key, "missing")
    for key in raw:
        if key not in KEYS:
            raise _fail(where, str(key), f"unknown key (known: {', '.join(KEYS)})")
    if not isinstance(ident, str) or not re.fullmatch(r"[a-z0-9_]+", ident):
        raise _fail(where, "id", f"{ident!r} is not a lowercase slug")
    if not isinstance(raw["title"], str) or not raw["title"].strip():
        raise _fail(where, "title", "must be a non-empty string")
    year = raw["year"]
    if year is not None and (isinstance(year, bool) or not isinstance(year, int)):
        raise _fail(where, "year", f"{year!r} is not an integer or null")
    arxiv = raw["arxiv"]
    if arxiv is not None and (not isinstance(arxiv, str) or not _ARXIV.fullmatch(arxiv)):
        raise _fail(where, "arxiv", f"{arxiv!r} is not an arXiv id like '2402.03300' (quote it) or null")
    catalogue = raw["catalogue"]
    if catalogue is not None and (not isinstance(catalogue, str) or not _CATALOGUE.fullmatch(catalogue)):
        raise _fail(where, "catalogue", f"{catalogue!r} is not like 'catalog_0 #1' ('; '-joined) or null")
    if raw["family"] not in FAMILIES:
        raise _fail(where, "family", f"{raw['family']!r} is not one of {', '.join(FAMILIES)}")
    status = raw["status"]
    if status not in STATUSES:
        raise _fail(where, "status", f"{status!r} is not one of {', '.join(STATUSES)}")
    note = raw["note"]
    if note is not None and not isinstance(note, str):
        raise _fail(where, "note", "must be a string or null")
    if status != "implemented" and not (note or "").strip():
        raise _fail(where, "note", f"a {status!r} paper needs a note")
    issue = raw["issue"]
    if issue is not None and (isinstance(issue, bool) or not isinstance(issue, int)):
        raise _fail(where, "issue", f"{issue!r} is not an integer or null")
    if status == "planned" and issue is None:
        raise _fail(where, "issue", "a 'planned' paper names the issue that brings it")
    configs = raw["configs"]
    if not isinstance(configs, list):
        raise _fail(where, "configs", "must be a list")
    if status in ("implemented", "partial") and not configs:
        raise _fail(where, "configs", f"a {status!r} paper names the configs that carry it")
    for config in configs:
        if not isinstance(config, str) or not _CONFIG.fullmatch(config):
            raise _fail(where, "configs", f"{config!r} is not of the form group/name")
        if not (conf_dir / f"{config}.yaml").is_file():
            raise _fail(where, "configs", f"{config!r}: no file {config}.yaml under {conf_dir}")
    return Paper(ident, raw["title"], year, arxiv, catalogue, raw["family"], status, note, issue, tuple(configs))


def load_papers(path: str | Path | None = None, conf_dir: str | Path | None = None) -> list[Paper]:
    """Read and validate the registry; a ValueError names the entry (id or index) and the key at fault."""
    path = Path(path) if path is not None else REGISTRY
    conf = Path(conf_dir) if conf_dir is not None else Path(CONF_DIR)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"paper registry {path}: the top level must be a list of entries")
    papers: list[Paper] = []
    seen: set[str] = set()
    for index, raw in enumerate(data):
        paper = _validate(raw, index, conf)
        if paper.id in seen:
            raise _fail(repr(paper.id), "id", "duplicate id")
        seen.add(paper.id)
        papers.append(paper)
    return papers


def filter_papers(papers: Iterable[Paper], status: str | None = None, family: str | None = None) -> list[Paper]:
    """The papers with this status and/or family (None: any)."""
    return [p for p in papers if (status is None or p.status == status) and (family is None or p.family == family)]


def summary(papers: Iterable[Paper]) -> str:
    """``N papers: implemented a · partial b · planned c · out of scope d``."""
    papers = list(papers)
    counts = Counter(p.status for p in papers)
    return f"{len(papers)} papers: " + " · ".join(f"{s} {counts.get(s, 0)}" for s in STATUSES)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_papers(papers: Iterable[Paper], status: str | None = None, family: str | None = None) -> str:
    """A fixed-width table (id, status, family, year, arXiv, catalogue, configs, title) and a summary line."""
    rows = filter_papers(papers, status, family)
    head = ("id", "status", "family", "year", "arxiv", "catalogue", "configs", "title")
    table = [head] + [
        (
            p.id,
            p.status,
            p.family,
            str(p.year or "-"),
            p.arxiv or "-",
            _clip(p.catalogue or "-", 30),
            _clip(", ".join(p.configs) or "-", 36),
            _clip(p.title, 70),
        )
        for p in rows
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 5)
    return "\n".join(lines + ["", summary(rows)])


def papers_json(papers: Iterable[Paper], status: str | None = None, family: str | None = None) -> str:
    """The filtered entries as a JSON list (keys as in the registry)."""
    return json.dumps([p.to_dict() for p in filter_papers(papers, status, family)], indent=2, ensure_ascii=False)


def main(argv: list[str]) -> None:
    """``rlexp list papers [--json] [--status S] [--family F]``; an unknown status or family exits 2."""
    parser = argparse.ArgumentParser(prog="rlexp list papers", description="The paper registry and its status.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--status", help=f"only this status: {', '.join(STATUSES)}")
    parser.add_argument("--family", help=f"only this family: {', '.join(FAMILIES)}")
    args = parser.parse_args(argv)
    status = args.status.replace("-", " ").replace("_", " ") if args.status else None
    if status is not None and status not in STATUSES:
        parser.error(f"unknown status {args.status!r}; valid: {', '.join(repr(s) for s in STATUSES)}")
    if args.family is not None and args.family not in FAMILIES:
        parser.error(f"unknown family {args.family!r}; valid: {', '.join(FAMILIES)}")
    papers = load_papers()
    view = papers_json if args.json else format_papers
    sys.stdout.write(view(papers, status=status, family=args.family) + "\n")


__all__ = [
    "KEYS",
    "REGISTRY",
    "STATUSES",
    "Paper",
    "filter_papers",
    "format_papers",
    "load_papers",
    "main",
    "papers_json",
    "summary",
]
