"""A bilingual dictionary tool: the policy looks a word up and reads back its entries (issue 28; the dictionary tool of
"Improving Low-Resource Translation with Dictionary-Guided Fine-Tuning and RL: A Spanish-to-Wayuunaiki Study",
Mosquera et al., 2025, arXiv 2508.19481, whose dictionary answers a queried word with its first five matches inside
``<matches>`` tags).

The dictionary is a local file, one entry a row, in one of these schemas:

* ``.tsv`` — a header line naming the columns ``source`` and ``target`` (tab-separated; more columns are allowed and
  ignored), then one entry a line; blank lines and lines starting with ``#`` are skipped;
* ``.jsonl`` — one JSON object a line with string fields ``source`` and ``target``;
* ``.json`` — a list of such objects, or an object mapping each source word to its target (a string or a list of
  strings: one entry each).

``source`` is the word or phrase in the language the policy reads (Spanish for the paper), ``target`` its translation
(Wayuunaiki). ``pkg:rlexp/...`` paths name files shipped in the package: the default,
``pkg:rlexp/tools/data/dictionary_es_en.tsv``, is a small Spanish→English sample for tests and demonstrations only —
the paper's Spanish–Wayuunaiki dictionary is not downloadable here; give its path as ``tools.dictionary.path``.

A lookup (``{"word": "casa"}``, or ``<dictionary>casa</dictionary>`` in the tag format) matches ``search`` side(s) of
the entries: first the entries whose whole side equals the query, then those that contain it as a whole word, in file
order, at most ``max_matches`` (5, the paper's); case, accents (``canción`` = ``cancion``) and the punctuation around
the query do not matter. A word with no entry is an answer (``no entry``), not an error; a call without a non-empty
string ``word`` is a counted tool error."""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

from rlexp.core.registry import TOOLS
from rlexp.tools import ToolResult

SEARCHES = ("source", "target", "both")
SAMPLE = "pkg:rlexp/tools/data/dictionary_es_en.tsv"


def normalise(text: str) -> str:
    """Lower case, accents dropped (NFKD without combining marks), inner whitespace collapsed, the punctuation around
    the text stripped."""
    text = unicodedata.normalize("NFKD", str(text).lower())
    text = "".join(c for c in text if not unicodedata.combining(c))
    return re.sub(r"\s+", " ", text).strip().strip(".,;:!?¡¿\"'()[]{}«»“”")


def dictionary_file(path: str) -> Path:
    """``pkg:<module>/<file>``: a file shipped inside an installed package; any other path is itself."""
    if not str(path).startswith("pkg:"):
        return Path(path)
    import importlib.util

    module, _, rel = str(path)[4:].partition("/")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"tools.dictionary.path={path}: package {module!r} is not installed")
    return Path(spec.origin).parent / rel


def load_entries(path: str) -> list[tuple[str, str]]:
    """The (source, target) entries of a dictionary file (module doc for the schemas); a malformed file raises a
    ``ValueError`` naming the file and the line or item."""
    p = dictionary_file(path)
    if not p.is_file():
        raise FileNotFoundError(f"tools.dictionary.path: no dictionary file at {path}")
    where = f"tools.dictionary.path={path}"
    if p.suffix == ".tsv":
        entries = _tsv_entries(p, where)
    elif p.suffix == ".jsonl":
        entries = []
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    item = json.loads(line)
                except ValueError as e:
                    raise ValueError(f"{where} line {n} is not valid JSON ({e})") from None
                entries.append(_object_entry(item, f"{where} line {n}"))
    elif p.suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            entries = []
            for source, target in data.items():
                for t in target if isinstance(target, list) else [target]:
                    entries.append(_object_entry({"source": source, "target": t}, f"{where} key {source!r}"))
        elif isinstance(data, list):
            entries = [_object_entry(item, f"{where} item {i + 1}") for i, item in enumerate(data)]
        else:
            raise ValueError(f"{where}: a .json dictionary is a list of {{source, target}} objects or an object")
    else:
        raise ValueError(f"{where}: unsupported dictionary file type {p.suffix!r}; use .tsv, .jsonl or .json")
    if not entries:
        raise ValueError(f"{where}: the dictionary has no entries")
    return entries


def _tsv_entries(p: Path, where: str) -> list[tuple[str, str]]:
    lines = [
        (n, line)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if line.strip() and line[0] != "#"
    ]
    if not lines:
        raise ValueError(f"{where}: empty dictionary file")
    header = [h.strip() for h in lines[0][1].split("\t")]
    if "source" not in header or "target" not in header:
        raise ValueError(
            f"{where} line {lines[0][0]}: the header must name the columns source and target, got {header}"
        )
    s, t = header.index("source"), header.index("target")
    entries = []
    for n, line in lines[1:]:
        cells = line.split("\t")
        if len(cells) <= max(s, t) or not cells[s].strip() or not cells[t].strip():
            raise ValueError(f"{where} line {n}: an entry needs a source and a target cell, got {line!r}")
        entries.append((cells[s].strip(), cells[t].strip()))
    return entries


def _object_entry(item, where: str) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: an entry is an object with source and target, got {type(item).__name__}")
    source, target = item.get("source"), item.get("target")
    if not isinstance(source, str) or not source.strip() or not isinstance(target, str) or not target.strip():
        raise ValueError(f"{where}: an entry needs non-empty string fields source and target, got {item!r}")
    return source.strip(), target.strip()


@TOOLS.register
class DictionaryTool:
    """Look a word up in a bilingual dictionary; its first ``max_matches`` entries come back in ``<matches>`` tags."""

    tag_argument = "word"

    def __init__(
        self,
        path: str = SAMPLE,
        name: str = "dictionary",
        max_matches: int = 5,
        search: str = "source",
        max_query_chars: int = 100,
    ):
        if max_matches < 1:
            raise ValueError(f"tools.{name}.max_matches must be >= 1, got {max_matches}")
        if search not in SEARCHES:
            raise ValueError(f"tools.{name}.search={search!r} is not one of {list(SEARCHES)}")
        self.name, self.path, self.max_matches, self.search = name, path, max_matches, search
        self.max_query_chars = max_query_chars
        self.entries = load_entries(path)
        self._keys = [(normalise(s), normalise(t)) for s, t in self.entries]
        self.description = (
            f"{name}: looks a word up in a bilingual dictionary and returns its first {max_matches} entries "
            f'(arguments: {{"word": "casa"}})'
        )

    def _sides(self, i: int) -> list[str]:
        s, t = self._keys[i]
        return {"source": [s], "target": [t], "both": [s, t]}[self.search]

    def lookup(self, word: str) -> list[tuple[str, str]]:
        """The entries matching ``word`` (module doc): whole-side matches first, then whole-word matches."""
        q = normalise(word)
        if not q:
            return []
        pattern = re.compile(rf"(?<!\w){re.escape(q)}(?!\w)")
        exact = [i for i in range(len(self.entries)) if q in self._sides(i)]
        seen = set(exact)
        inner = [
            i for i in range(len(self.entries)) if i not in seen and any(pattern.search(x) for x in self._sides(i))
        ]
        return [self.entries[i] for i in (exact + inner)[: self.max_matches]]

    def __call__(self, arguments: dict) -> ToolResult:
        word = arguments.get("word")
        if not isinstance(word, str) or not normalise(word):
            return ToolResult(f"{self.name}: needs a non-empty string argument `word`", error=True)
        if len(word) > self.max_query_chars:
            return ToolResult(f"{self.name}: the query is longer than {self.max_query_chars} characters", error=True)
        found = self.lookup(word)
        if not found:
            return ToolResult(f"<matches>\nno entry for {word.strip()!r}\n</matches>")
        return ToolResult("<matches>\n" + "\n".join(f"{s} = {t}" for s, t in found) + "\n</matches>")
