"""A retrieval (search) tool over a local corpus (issue 28): the policy writes a query, the top-k documents of a BM25
index come back — the local search engine of Search-R1, StepSearch and SSRL's sim-to-real runs, without a dense
retriever or a server.

Corpus: a JSONL (or ``.jsonl.gz``) file, one document a line, in the schema Search-R1 and FlashRAG use for wiki-18
— ``{"id", "contents"}`` with ``contents = '"Title"\\ntext'`` — or ``{"id", "title", "text"}`` (``"content"`` also
read, as StepSearch's README writes it). The default corpus is the synthetic facts of ``dataset=search_facts``
(``rlexp.data.search_facts.corpus_file``, written to the cache at first use), whose facts no model can know; any
local path works: ``tools.retrieval.corpus=/data/wiki-18.jsonl``. The documents are held in memory.

Index: Okapi BM25 in Lucene's form (``bm25s``, the optional extra ``rlexp[agents]``; "BM25S: Orders of magnitude
faster lexical search via eager sparse scoring", Lù, 2024): score(q, d) = Σ_{t∈q} idf(t) · tf / (tf + k1·(1 − b +
b·|d| / avgdl)), idf(t) = ln(1 + (N − df + 0.5) / (df + 0.5)), k1 = 1.5, b = 0.75; a document is its title and
text, tokenised as lower-case word characters (``\\w+``) without Lucene's 33 English stop words. Built when the
tool is made, before any rollout; with ``index_dir`` it is saved there and loaded by later runs (``auto``: under the
cache, keyed by the corpus file's path, size and time and the settings; ``python -m rlexp.tools.retrieval CORPUS
[INDEX_DIR]`` builds it ahead).

A call (``name`` ``search``): ``<tool_call>{"name": "search", "arguments": {"query": "Orla Venmark born"}}
</tool_call>`` (``call_format: json``) or ``<search>Orla Venmark born</search>`` (``call_format: tags``, as
Search-R1 writes it: the body is the query). The ``top_k`` best documents with a score above 0 (ties in corpus
order) come back one a line, in Search-R1's layout ``Doc 1(Title: Orla Venmark) Orla Venmark was …``, each clipped
to ``max_doc_chars``, the whole to ``max_output_chars``; ``parse_results`` reads them back (StepSearch's step
rewards). An empty or over-long query, one without a searchable word (only stop words or punctuation), or a
non-string query is an error returned to the model (a counted tool error); a query that matches nothing returns
"No documents match the query." (not an error)."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
from pathlib import Path

from rlexp.core.registry import TOOLS
from rlexp.tools import ToolResult, clip_text

_WORD = re.compile(r"\w+")
_RESULT = re.compile(r"^Doc \d+\(Title: (.*?)\) (.*)$")
NO_MATCH = "No documents match the query."
INDEX_FORMAT = 1  # bump when what is saved beside a bm25s index changes


def _bm25s():
    try:
        import bm25s
    except ImportError as e:
        raise ImportError("tools=[retrieval] needs bm25s: pip install 'rlexp[agents]' (bm25s==0.3.16)") from e
    return bm25s


def stop_words() -> frozenset[str]:
    """Lucene's English stop words (as ``bm25s`` ships them)."""
    return frozenset(_bm25s().stopwords.STOPWORDS_EN)


def tokenize(text: str, stopwords: frozenset[str] = frozenset()) -> list[str]:
    """Lower-case word tokens of ``text`` without ``stopwords``."""
    return [t for t in _WORD.findall(text.lower()) if t not in stopwords]


def split_contents(contents: str) -> tuple[str, str]:
    """(title, text) of a wiki-18 ``contents`` field ``'"Title"\\ntext'`` (the title's quotes dropped)."""
    title, _, text = str(contents).partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def load_corpus(path: str | Path) -> list[dict]:
    """The documents ``{"id", "title", "text"}`` of a corpus JSONL (see module doc), in file order."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"tools.retrieval.corpus={path}: no such file (a JSONL of {{id, contents}})")
    opener = gzip.open if p.suffix == ".gz" else open
    docs = []
    with opener(p, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"tools.retrieval.corpus={path} line {n}: not JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise ValueError(f"tools.retrieval.corpus={path} line {n}: not a JSON object")
            if "contents" in row:
                title, text = split_contents(row["contents"])
            elif "text" in row or "content" in row:
                title, text = str(row.get("title") or ""), str(row.get("text", row.get("content")) or "")
            else:
                raise ValueError(
                    f"tools.retrieval.corpus={path} line {n}: a document needs `contents` ('\"Title\"\\ntext') "
                    f"or `title` and `text`; got keys {sorted(row)}"
                )
            docs.append({"id": str(row.get("id", n - 1)), "title": title, "text": text})
    if not docs:
        raise ValueError(f"tools.retrieval.corpus={path}: no documents")
    return docs


class BM25Index:
    """A BM25 index of ``docs`` (``bm25s``, Lucene's variant; see module doc). ``search(query, k)``: the (document
    index, score) pairs of the ``k`` best documents scoring above 0, best first, ties in corpus order."""

    def __init__(self, docs: list[dict], k1: float = 1.5, b: float = 0.75, stopwords: bool = True, model=None):
        if k1 < 0 or not 0.0 <= b <= 1.0:
            raise ValueError(f"tools.retrieval: k1 must be >= 0 and b in [0, 1], got k1={k1}, b={b}")
        self.docs, self.k1, self.b = docs, float(k1), float(b)
        self.stopwords = stop_words() if stopwords else frozenset()
        if model is None:
            model = _bm25s().BM25(k1=self.k1, b=self.b, method="lucene")
            model.index([tokenize(f"{d['title']} {d['text']}", self.stopwords) for d in docs], show_progress=False)
        self.model = model

    def query_tokens(self, query: str) -> list[str]:
        return tokenize(query, self.stopwords)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        import numpy as np

        tokens = [t for t in self.query_tokens(query) if t in self.model.vocab_dict]
        if not tokens:
            return []
        scores = np.asarray(self.model.get_scores(tokens), dtype=np.float64)
        hits = np.flatnonzero(scores > 0)
        order = hits[np.lexsort((hits, -scores[hits]))][:k]  # by score, then corpus order
        return [(int(i), float(scores[i])) for i in order]

    def save(self, folder: str | Path, meta: dict) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save(str(folder), show_progress=False)
        (folder / "rlexp_index.json").write_text(json.dumps(meta, sort_keys=True))  # written last: the index is whole

    @classmethod
    def load(cls, folder: str | Path, docs: list[dict], meta: dict, k1: float, b: float, stopwords: bool):
        """The index saved in ``folder`` if it was built from the same corpus and settings (``meta``), else None."""
        folder = Path(folder)
        try:
            saved = json.loads((folder / "rlexp_index.json").read_text())
        except (OSError, ValueError):
            return None
        if saved != meta:
            return None
        model = _bm25s().BM25.load(str(folder), show_progress=False, verbosity=0)
        return cls(docs, k1, b, stopwords, model=model)


def index_meta(corpus: Path, k1: float, b: float, stopwords: bool) -> dict:
    st = corpus.stat()
    return {
        "corpus": str(corpus.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "k1": k1,
        "b": b,
        "stopwords": stopwords,
        "v": INDEX_FORMAT,
    }


def build_index(corpus: str | Path, index_dir: str | Path | None = None, k1=1.5, b=0.75, stopwords=True):
    """(documents, index) of ``corpus``; with ``index_dir`` (``auto``: in the cache) loaded from there when it holds
    this corpus's index, else built and saved there."""
    path = Path(corpus)
    docs = load_corpus(path)
    if index_dir is None:
        return docs, BM25Index(docs, k1, b, stopwords)
    meta = index_meta(path, float(k1), float(b), bool(stopwords))
    if str(index_dir) == "auto":
        from rlexp.models.loading import default_cache_dir

        digest = hashlib.sha1(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]
        index_dir = default_cache_dir() / "retrieval" / f"{path.stem}-{digest}"
    index = BM25Index.load(index_dir, docs, meta, k1, b, stopwords)
    if index is None:
        index = BM25Index(docs, k1, b, stopwords)
        index.save(index_dir, meta)
    return docs, index


def format_results(docs: list[dict], max_doc_chars: int = 0) -> str:
    """Documents one a line in Search-R1's layout: ``Doc 1(Title: T) text`` (line breaks in a text made spaces)."""
    lines = []
    for i, d in enumerate(docs, 1):
        text = clip_text(" ".join(d["text"].split()), max_doc_chars)
        lines.append(f"Doc {i}(Title: {' '.join(d['title'].split())}) {text}")
    return "\n".join(lines)


def parse_results(text: str) -> list[tuple[str, str]]:
    """The (title, text) of each document line of a search result (``format_results``), in order; other lines
    (an error, a chat template's role names) are skipped."""
    out = []
    for line in text.splitlines():
        m = _RESULT.match(line.strip())
        if m:
            out.append((m.group(1), m.group(2)))
    return out


@TOOLS.register
class RetrievalTool:
    """Search a local corpus with BM25; the top ``top_k`` documents come back (see module doc)."""

    tag_argument = "query"

    def __init__(
        self,
        corpus: str,
        name: str = "search",
        top_k: int = 3,
        max_doc_chars: int = 300,
        max_output_chars: int = 1000,
        max_query_chars: int = 300,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: bool = True,
        index_dir: str | None = None,
    ):
        if top_k < 1:
            raise ValueError(f"tools.retrieval.top_k must be >= 1, got {top_k}")
        if max_query_chars < 1:
            raise ValueError(f"tools.retrieval.max_query_chars must be >= 1, got {max_query_chars}")
        if not corpus:
            raise ValueError("tools.retrieval.corpus is not set: a JSONL of {id, contents} documents")
        self.name, self.top_k, self.max_doc_chars = name, int(top_k), int(max_doc_chars)
        self.max_output_chars, self.max_query_chars = int(max_output_chars), int(max_query_chars)
        self.docs, self.index = build_index(corpus, index_dir, k1, b, stopwords)
        self.description = (
            f"{name}: searches a collection of documents and returns the {top_k} most relevant (arguments: "
            f'{{"query": <search words>}})'
        )

    def search(self, query: str, k: int | None = None) -> list[dict]:
        """The documents of the ``k`` (default ``top_k``) best hits of ``query``, best first."""
        return [self.docs[i] for i, _ in self.index.search(query, k or self.top_k)]

    def __call__(self, arguments: dict) -> ToolResult:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            return ToolResult(f"{self.name}: needs a non-empty string argument `query`", error=True)
        if len(query) > self.max_query_chars:
            return ToolResult(f"{self.name}: the query is longer than {self.max_query_chars} characters", error=True)
        if not self.index.query_tokens(query):
            return ToolResult(f"{self.name}: the query {query.strip()!r} has no words to search for", error=True)
        docs = self.search(query)
        if not docs:
            return ToolResult(NO_MATCH)
        return ToolResult(clip_text(format_results(docs, self.max_doc_chars), self.max_output_chars))


def main(argv: list[str] | None = None) -> int:
    """``python -m rlexp.tools.retrieval CORPUS [INDEX_DIR]``: build (and save) a corpus's BM25 index ahead."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print("usage: python -m rlexp.tools.retrieval CORPUS.jsonl [INDEX_DIR | auto]", file=sys.stderr)
        return 2
    docs, _ = build_index(args[0], args[1] if len(args) > 1 else "auto")
    print(f"indexed {len(docs)} documents of {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
