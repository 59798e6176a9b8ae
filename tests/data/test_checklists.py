"""KLCF's offline checklists (rlexp.data.checklists): recurring facts across the base model's answers, worked out by
hand with a fake sampler, the jsonl cache, the dataset source, and one real build on the tiny model."""

import json

import pytest
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.data.checklists import (
    ChecklistSettings,
    build_checklist,
    build_checklists,
    checklist_dataset,
)
from rlexp.data.generation import hf_sampler

FIXTURE = "tests/fixtures/data/longfact_checklists.jsonl"

A = "Mars is the fourth planet from the Sun."  # {mars, fourth, planet, sun}
B = "Mars has two moons."  # {mars, two, moon}
C = "Mars is made of cheese."  # {mars, made, cheese}
D = "It has two small moons called Phobos and Deimos."  # {two, small, moon, called, phobo, deimo}
ANSWERS = [
    f"{A} {B} {C}",
    f"{A} {D}",  # D vs B: Dice 2·|{two, moon}| / (6 + 3) = 0.44 < 0.6, a fact of its own
    "The fourth planet from the Sun is Mars. Mars has two moons.",  # the same tokens as A and B: Dice 1
]


def test_recurring_facts_by_hand():
    # support: A in answers {0, 1, 2}, B in {0, 2}, C in {0}, D in {1}
    s = ChecklistSettings(k=3, min_support=2)
    assert build_checklist(ANSWERS, s) == ([A, B], [3, 2])
    everything = ChecklistSettings(k=3, min_support=1, max_facts=3)  # ties broken by first sight: C before D
    assert build_checklist(ANSWERS, everything) == ([A, B, C], [3, 2, 1])
    # a stricter match splits A from its reordering? No: same token set, Dice 1 at any threshold
    assert build_checklist(ANSWERS, ChecklistSettings(k=3, min_support=3, match_threshold=1.0)) == ([A], [3])


def test_an_answer_repeating_a_fact_supports_it_once():
    # "Nothing here at all." has one content token (< 3): not a claim
    answers = [f"{B} {B}", "Nothing here at all."]
    assert build_checklist(answers, ChecklistSettings(k=2, min_support=2)) == ([], [])
    assert build_checklist(answers, ChecklistSettings(k=2, min_support=1)) == ([B], [1])


@pytest.mark.parametrize(
    "kwargs, key",
    [({"k": 0}, "k=0"), ({"k": 2, "min_support": 3}, "min_support"), ({"match_threshold": 0}, "match_threshold")],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ChecklistSettings(**kwargs)


class FakeSampler:
    """The three Mars answers for every question; counts the questions it was asked."""

    def __init__(self):
        self.asked = []

    def __call__(self, questions, k):
        self.asked.append(list(questions))
        return [ANSWERS[:k] for _ in questions]


def test_build_checklists_samples_each_question_once_and_caches(tmp_path):
    cache, sampler = tmp_path / "c.jsonl", FakeSampler()
    s = ChecklistSettings(k=3, min_support=2)
    rows = build_checklists(["Q1", "Q2", "Q1"], sampler, s, cache, model_name="fake")
    assert sampler.asked == [["Q1", "Q2"]]
    assert [r["prompt"] for r in rows] == ["Q1", "Q2", "Q1"] and rows[0]["checklist"] == [A, B]
    assert rows[0]["support"] == [3, 2] and rows[0]["model"] == "fake" and len(cache.read_text().splitlines()) == 2
    rows = build_checklists(["Q2", "Q3"], sampler, s, cache)
    assert sampler.asked[-1] == ["Q3"] and len(cache.read_text().splitlines()) == 3
    build_checklists(["Q2"], sampler, ChecklistSettings(k=2, min_support=2), cache)  # other settings: sampled anew
    assert sampler.asked[-1] == ["Q2"]
    with pytest.raises(ValueError, match="answers"):
        build_checklists(["Q9"], lambda qs, k: [["one answer"]], s)


def test_the_fixture_dataset_carries_checklists():
    splits = checklist_dataset(FIXTURE, seed=0, eval_size=4)
    assert len(splits.train) == 10 and len(splits.eval) == 4
    r = splits.train[0]
    assert r["scorer"] == "checklist" and len(r["checklist"]) == 4 and r["answer"] == "; ".join(r["checklist"])
    assert r["metadata"]["topic"] and r["metadata"]["checklist_built"] is False


def test_rows_without_a_checklist_are_refused_unless_built(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Who was person {i}?"}) + "\n" for i in range(3)))
    with pytest.raises(ValueError, match="row 1 has no 'checklist'.*dataset.build.enabled"):
        checklist_dataset(str(path), seed=0, eval_size=1)
    with pytest.raises(ValueError, match="column 'question'"):
        checklist_dataset(str(path), seed=0, eval_size=1, question_column="question")


def test_a_real_build_on_the_tiny_model_is_cached(tmp_path, tiny, monkeypatch):
    # the sampler alone: k answers per question
    answers = hf_sampler(tiny.model, tiny.tokenizer, max_new_tokens=6)(["What is Mars?", "Who was Mozart?"], 2)
    assert [len(a) for a in answers] == [2, 2] and all(isinstance(t, str) for a in answers for t in a)
    # the dataset source builds the missing checklists from the model entry and reads them back from the cache
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Who was person {i}?"}) + "\n" for i in range(3)))
    build = {
        "enabled": True,
        "model": OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml"),
        "device": "cpu",
        "k": 2,
        "min_support": 1,
        "min_claim_tokens": 1,
        "max_new_tokens": 8,
    }
    splits = checklist_dataset(str(path), seed=0, eval_size=1, build=build)
    records = splits.train + splits.eval
    assert len(records) == 3 and all(r["metadata"]["checklist_built"] for r in records)
    assert all(isinstance(r["checklist"], list) for r in records)
    cache = tmp_path / "p.jsonl.checklists.jsonl"
    lines = cache.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["model"] == "tiny-smollm2"
    monkeypatch.setattr("rlexp.models.loading.load_model", lambda *a: pytest.fail("the cache is complete: no model"))
    again = checklist_dataset(str(path), seed=0, eval_size=1, build=build)
    assert cache.read_text().splitlines() == lines  # read back, not sampled again
    assert [r["checklist"] for r in again.train] == [r["checklist"] for r in splits.train]
