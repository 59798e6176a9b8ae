"""The synthetic facts of dataset=search_facts (issue 28): a deterministic world, its corpus in wiki-18's schema,
questions in the NQ/HotpotQA schema whose supporting documents really hold the answer, and a BM25 search that finds
them."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rlexp.data.search_facts import KINDS, corpus_file, documents, questions, search_facts, world
from rlexp.rewards.terms import check_answer
from rlexp.tools.retrieval import RetrievalTool, load_corpus


def test_the_world_is_deterministic_and_hash_made():
    assert world(0) == world(0) and world(0) != world(1)
    docs = documents(world(0))
    # made by SHA-256 picks, so the same on every Python and machine: pinned
    assert docs[0] == {
        "id": "t0",
        "title": "Ulvercombe",
        "text": "Ulvercombe is a town in Quarvia on the river Yarrow. It was founded in 1350.",
    }
    assert docs[24]["text"] == "Sabine Quenberg was an astronomer born in 1795 in Craywick."
    assert len(docs) == 48 + 24 + 24 and len({d["id"] for d in docs}) == len(docs)
    assert len({d["title"] for d in docs}) == len(docs)  # every entity has its own name


def test_questions_follow_the_schema_and_their_documents_hold_the_answer():
    w = world(0)
    qs = questions(w)
    assert len(qs) == 3 * 48 + 24 + 4 * 24 == 264 and len({q["question"] for q in qs}) == 264
    assert Counter(q["metadata"]["kind"] for q in qs) == {
        "birth_year": 48,
        "birthplace": 48,
        "birthplace_river": 48,
        "river": 24,
        "founder": 24,
        "founder_birth_year": 24,
        "founder_birthplace": 24,
        "headquarters_river": 24,
    }
    ids = {d["id"]: d for d in documents(w)}
    for q in qs:
        meta = q["metadata"]
        assert set(q) == {"id", "question", "answer", "scorer", "metadata"} and q["scorer"] == "qa"
        support = meta["supporting_docs"]
        assert meta["hops"] == len(support) == len(meta["search_keys"]) in (1, 2)
        assert all(ids[d["id"]] == d for d in support)
        assert q["answer"] in support[-1]["text"]  # the last hop's document states the answer
        assert q["answer"] in meta["answers"]
        if meta["hops"] == 2:  # the first document names the bridge entity, the second is about it
            assert support[1]["title"] in support[0]["text"]
            assert support[1]["title"] not in q["question"]
    two = next(q for q in qs if q["metadata"]["kind"] == "birthplace_river")
    assert two["question"] == "On which river lies the town where Sabine Quenberg was born?"
    assert two["answer"] == "Ulla" and two["metadata"]["search_keys"][1] == ["Craywick", "Craywick river"]


def test_the_corpus_file_is_wiki18_jsonl_written_once(tmp_path):
    path = corpus_file(cache_dir=str(tmp_path))
    lines = [json.loads(line) for line in open(path)]
    assert lines[0] == {
        "id": "t0",
        "contents": '"Ulvercombe"\nUlvercombe is a town in Quarvia on the river Yarrow. It was founded in 1350.',
    }
    assert load_corpus(path) == documents(world(0))
    qa = [json.loads(line) for line in open(path.replace("corpus.jsonl", "qa.jsonl"))]
    assert qa == questions(world(0))
    stamp = (tmp_path / path).stat().st_mtime_ns
    assert corpus_file(cache_dir=str(tmp_path)) == path and (tmp_path / path).stat().st_mtime_ns == stamp
    assert corpus_file(seed=1, cache_dir=str(tmp_path)) != path  # another world, another folder


def test_splits_kinds_and_the_qa_scorer(tmp_path):
    splits = search_facts(seed=3, eval_size=64, cache_dir=str(tmp_path))
    assert len(splits.train) == 200 and len(splits.eval) == 64
    assert not {r["question"] for r in splits.train} & {r["question"] for r in splits.eval}
    one = search_facts(seed=3, kinds=["river"], eval_size=4, cache_dir=str(tmp_path))
    assert {r["metadata"]["kind"] for r in one.train + one.eval} == {"river"}
    river = one.train[0]
    # SQuAD-normalised exact match over the answer and its aliases
    assert check_answer(f"The {river['answer']}.", river) == 1.0
    assert check_answer(f"river {river['answer'].lower()}", river) == 1.0
    assert check_answer("Nowhere", river) == 0.0 and check_answer(None, river) == 0.0
    with pytest.raises(ValueError, match=r"dataset.kinds: \['colour'\] not among"):
        questions(world(0), ["colour"])
    with pytest.raises(ValueError, match="dataset.people must be >= 1"):
        world(0, people=0)
    assert set(KINDS) == {r["metadata"]["kind"] for r in questions(world(0))}


def test_bm25_finds_the_supporting_document_from_the_search_key(tmp_path):
    tool = RetrievalTool(corpus_file(cache_dir=str(tmp_path)), top_k=3)
    qs = questions(world(0))
    for q in qs:
        for key, doc in zip(q["metadata"]["search_keys"], q["metadata"]["supporting_docs"]):
            top = [d["id"] for d in tool.search(key[0], 3)]
            assert doc["id"] in top, (key, top)
