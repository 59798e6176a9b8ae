"""The retrieval tool (issue 28): BM25 ranking worked out by hand on a 4-document corpus, the corpus schemas, the
search call in both formats, errors returned as counted tool errors, the saved index."""

from __future__ import annotations

import json
import math

import pytest

from rlexp.environments.tool_use import ToolUse
from rlexp.tools.calls import parse_calls
from rlexp.tools.retrieval import (
    NO_MATCH,
    RetrievalTool,
    build_index,
    format_results,
    load_corpus,
    parse_results,
    split_contents,
)

# title + text, lower-cased, Lucene's stop words dropped: d0 [alpha, red, fox] (3 tokens), d1 [beta, red, red, dog]
# (4), d2 [gamma, blue, fox] (3), d3 [delta, green, owl] (3); N = 4, avgdl = 13 / 4 = 3.25
DOCS = [
    {"id": "d0", "contents": '"Alpha"\nThe red fox.'},
    {"id": "d1", "contents": '"Beta"\nA red, red dog.'},
    {"id": "d2", "title": "Gamma", "text": "Blue fox"},
    {"id": "d3", "title": "Delta", "text": "Green owl"},
]


def bm25(tf: int, dl: int, df: int, n: int = 4, avgdl: float = 3.25, k1: float = 1.5, b: float = 0.75) -> float:
    """Lucene's BM25 term score: idf · tf / (tf + k1 · (1 − b + b · dl / avgdl))."""
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n\n")  # a blank line is skipped
    return path


def test_bm25_ranks_the_four_documents_as_worked_out_by_hand(corpus):
    tool = RetrievalTool(str(corpus), top_k=3)
    # "red fox": idf(red) = idf(fox) = ln(1 + 2.5 / 2.5) = ln 2 (df = 2 each)
    # d0: red and fox once, dl 3: 2 · ln2 · 1 / (1 + 1.5 · (0.25 + 0.75 · 3 / 3.25)) = 2 · 0.693147 · 0.414343
    # d1: red twice, dl 4: ln2 · 2 / (2 + 1.5 · (0.25 + 0.75 · 4 / 3.25)) = 0.693147 · 0.531969; d2: fox once, dl 3
    hits = tool.index.search("red fox", 4)
    assert [i for i, _ in hits] == [0, 1, 2]  # d3 scores 0: left out
    d0, d1, d2 = (s for _, s in hits)
    assert d0 == pytest.approx(2 * bm25(1, 3, 2), rel=1e-5) == pytest.approx(0.574402, rel=1e-5)
    assert d1 == pytest.approx(bm25(2, 4, 2), rel=1e-5) == pytest.approx(0.368731, rel=1e-5)
    assert d2 == pytest.approx(bm25(1, 3, 2), rel=1e-5) == pytest.approx(0.287201, rel=1e-5)
    assert [i for i, _ in tool.index.search("fox", 4)] == [0, 2]  # a tie: corpus order
    assert [d["id"] for d in tool.search("red fox", 2)] == ["d0", "d1"]
    res = tool({"query": "red fox"})
    assert not res.error
    assert res.text == (
        "Doc 1(Title: Alpha) The red fox.\nDoc 2(Title: Beta) A red, red dog.\nDoc 3(Title: Gamma) Blue fox"
    )


def test_the_corpus_schemas_of_wiki18_and_title_text(corpus, tmp_path):
    assert load_corpus(corpus) == [
        {"id": "d0", "title": "Alpha", "text": "The red fox."},
        {"id": "d1", "title": "Beta", "text": "A red, red dog."},
        {"id": "d2", "title": "Gamma", "text": "Blue fox"},
        {"id": "d3", "title": "Delta", "text": "Green owl"},
    ]
    assert split_contents('"Heartbeat Song"\nA song.\nMore.') == ("Heartbeat Song", "A song.\nMore.")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "body": "x"}\n')
    with pytest.raises(ValueError, match=r"line 1: a document needs `contents`"):
        load_corpus(bad)
    with pytest.raises(FileNotFoundError, match="tools.retrieval.corpus="):
        RetrievalTool(str(tmp_path / "missing.jsonl"))


def test_a_search_call_parses_in_both_formats(corpus):
    tools = {"search": RetrievalTool(str(corpus))}
    (tag,) = parse_calls("I will look. <search> red fox </search>", "tags", tools)
    assert (tag.name, tag.arguments, tag.error) == ("search", {"query": "red fox"}, None)
    (js,) = parse_calls('<tool_call>{"name": "search", "arguments": {"query": "owl"}}</tool_call>', "json", tools)
    assert (js.name, js.arguments, js.error) == ("search", {"query": "owl"}, None)


def test_malformed_and_empty_queries_are_counted_tool_errors(corpus):
    tool = RetrievalTool(str(corpus), max_query_chars=20)
    for args in ({"query": ""}, {"query": "   "}, {"query": 3}, {"q": "fox"}, {"query": "the of, and!"}):
        res = tool(args)
        assert res.error, args
    assert "no words to search for" in tool({"query": "the of"}).text
    assert tool({"query": "fox " * 6}).error  # 24 characters > 20
    nothing = tool({"query": "zebra"})
    assert not nothing.error and nothing.text == NO_MATCH  # a valid search that finds nothing
    env = ToolUse({"retrieval": tool}, call_format="tags")
    episode = env({})
    step = episode.step("<search></search>")
    assert step.info == {"tool_calls": 1, "tool_errors": 1, "malformed_calls": 0} and not step.done
    assert "needs a non-empty string argument `query`" in step.observation
    step = episode.step("<search>owl")  # unterminated: malformed, counted
    assert step.info["tool_errors"] == 1 and "unterminated <search>" in step.observation
    ok = episode.step("<search>green owl</search>")
    assert ok.info["tool_errors"] == 0 and ok.observation == "Doc 1(Title: Delta) Green owl"
    assert episode.step("<answer>owl</answer>").done  # no call: the final answer


def test_results_are_clipped_and_read_back(corpus):
    docs = [{"title": "A\nB", "text": "one\ntwo " + "x" * 50}, {"title": "C", "text": "three"}]
    text = format_results(docs, max_doc_chars=12)
    assert text.splitlines() == ["Doc 1(Title: A B) one two xxxx... [46 more characters cut]", "Doc 2(Title: C) three"]
    assert parse_results("\ntool\n" + text + "\nassistant\n") == [
        ("A B", "one two xxxx... [46 more characters cut]"),
        ("C", "three"),
    ]
    assert parse_results("search: the query has no words") == []
    short = RetrievalTool(str(corpus), max_output_chars=30)({"query": "red fox"})
    assert short.text.endswith("more characters cut]") and short.text.startswith("Doc 1(Title: Alpha)")


def test_a_saved_index_is_reused_and_rebuilt_when_the_corpus_changes(corpus, tmp_path):
    folder = tmp_path / "index"
    docs, index = build_index(corpus, folder)
    stamp = (folder / "rlexp_index.json").stat().st_mtime_ns
    again_docs, again = build_index(corpus, folder)  # loaded, not rebuilt: the saved files are untouched
    assert (folder / "rlexp_index.json").stat().st_mtime_ns == stamp
    assert again.search("red fox", 4) == index.search("red fox", 4) and again_docs == docs
    corpus.write_text(corpus.read_text() + json.dumps({"id": "d4", "title": "Eps", "text": "red fox den"}) + "\n")
    _, rebuilt = build_index(corpus, folder)  # the corpus changed: the saved index is not used
    assert len(rebuilt.docs) == 5 and rebuilt.search("den", 1)[0][0] == 4


def test_bad_settings_name_the_key(corpus):
    with pytest.raises(ValueError, match="tools.retrieval.top_k must be >= 1"):
        RetrievalTool(str(corpus), top_k=0)
    with pytest.raises(ValueError, match="tools.retrieval: k1 must be >= 0 and b in"):
        RetrievalTool(str(corpus), b=2.0)
