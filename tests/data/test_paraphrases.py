"""Paraphrase sources (rlexp/data/paraphrases.py) and a local file's paraphrase columns."""

import json

import pytest

from rlexp.config.schema import ConfigError
from rlexp.data.paraphrases import (
    ModelParaphrases,
    RecordParaphrases,
    TemplateParaphrases,
    paraphrase_source,
    parse_rewrite,
    reworded,
)
from rlexp.data.sources import local_file


def test_rewordings_swap_the_instruction_verb_and_keep_the_task():
    out = reworded("Calculate 61 + 73.")
    assert "Compute 61 + 73." in out and "What is 61 + 73?" in out
    assert "Calculate 61 + 73." not in out  # never the question itself
    assert all("61 + 73" in text for text in out)
    # a question without a known verb is wrapped, unchanged inside
    q = "State the final answer to the following arithmetic problem: 6 - 7 ="
    assert all(q in text for text in reworded(q)) and len(reworded(q)) >= 3
    # "What is ...?" reads back as the verbs
    assert "Calculate 2 + 2." in reworded("What is 2 + 2?")


def test_template_source_is_seeded_distinct_and_variant_zero_is_the_question():
    rec = {"id": "r1", "question": "Calculate 61 + 73."}
    a, b = TemplateParaphrases(seed=0), TemplateParaphrases(seed=1)
    first = [a(rec, k) for k in range(4)]
    assert first[0] == rec["question"]
    assert len(set(first)) == 4  # three distinct paraphrases
    assert first == [a(rec, k) for k in range(4)]  # deterministic
    assert first[1:] != [b(rec, k) for k in range(1, 4)]  # another seed, another draw


def test_record_source_reads_the_dataset_and_names_a_short_record():
    rec = {"id": "r7", "question": "q", "paraphrases": ["p1", "p2"]}
    src = RecordParaphrases()
    assert [src(rec, k) for k in range(3)] == ["q", "p1", "p2"]
    assert RecordParaphrases("rewritten")({"id": "r", "question": "q", "rewritten": "one"}, 1) == "one"
    with pytest.raises(ValueError, match="'r7' has 2 paraphrase"):
        src(rec, 3)
    with pytest.raises(ValueError, match="source='llm' is not one of"):
        paraphrase_source("llm")


def test_local_file_keeps_paraphrase_columns_in_order(tmp_path):
    """Co-Reward's rewritten question beside the original (one column) and a paraphrase set (a list column)."""
    path = tmp_path / "math.jsonl"
    rows = [
        {"problem": "What is 2+3?", "answer": "5", "rewrite": "Tom has 2 apples and gets 3. How many?", "set": ["a"]},
        {"problem": "What is 4+4?", "answer": "8", "rewrite": "Double 4.", "set": ["b", "c"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    data = local_file(str(path), seed=0, question_column="problem", paraphrase_columns=["rewrite", "set"], eval_size=0)
    by_q = {r["question"]: r for r in data.train}
    assert by_q["What is 2+3?"]["paraphrases"] == ["Tom has 2 apples and gets 3. How many?", "a"]
    assert by_q["What is 4+4?"]["paraphrases"] == ["Double 4.", "b", "c"]
    rows[1]["rewrite"] = None
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ConfigError, match="row 2: column 'rewrite' is null"):
        local_file(str(path), seed=0, question_column="problem", paraphrase_columns=["rewrite"], eval_size=0)
    with pytest.raises(ValueError, match="row 1 has no column 'nope'"):
        local_file(str(path), seed=0, question_column="problem", paraphrase_columns=["nope"], eval_size=0)


# ---- an LLM's rewrites (Co-Reward's recipe) ------------------------------------------------------------------------
def test_parse_rewrite_reads_the_marker_and_refuses_unusable_replies():
    q = "Calculate 61 + 73."
    assert parse_rewrite("REWRITE:\nAdd 61 apples to 73 apples.\nEND junk", q) == "Add 61 apples to 73 apples."
    assert parse_rewrite("Sure! Add 61 and 73.", q) is None  # no marker
    assert parse_rewrite("REWRITE:\n  \nEND", q) is None  # empty
    assert parse_rewrite("REWRITE: Calculate 61 + 73.", q) is None  # the question itself
    assert parse_rewrite("REWRITE: Add 61 and 37.", q) is None  # a number of the question is gone
    assert parse_rewrite("REWRITE: Add 61 and 37.", q, keep_numbers=False) == "Add 61 and 37."


class ScriptedRewriter:
    """Rewrites 'Calculate X.' as 'Work out X, please.' on the first sample and answers nonsense after."""

    def __init__(self):
        self.calls = []

    def __call__(self, texts, k):
        self.calls.append((len(texts), k))
        out = []
        for t in texts:
            body = t.split("Problem:\n", 1)[1].removeprefix("Calculate ").rstrip(".")
            out.append([f"REWRITE:\nWork out {body}, please.\nEND"] + ["I cannot."] * (k - 1))
        return out


def test_model_source_batches_caches_and_falls_back(tmp_path):
    cache = tmp_path / "rewrites.jsonl"
    recs = [{"id": "a", "question": "Calculate 2 + 3."}, {"id": "b", "question": "Calculate 4 + 4."}]
    rewriter = ScriptedRewriter()
    src = ModelParaphrases(sampler=rewriter, cache=str(cache))
    src.prepare(recs, [0, 1, 2])
    assert rewriter.calls == [(2, 2)]  # one call for the batch: 2 questions x 2 rewrites
    assert src(recs[0], 1) == "Work out 2 + 3, please."
    assert src(recs[0], 2) == TemplateParaphrases(0)({"id": "Calculate 2 + 3.", "question": "Calculate 2 + 3."}, 2)
    assert src.fallbacks == 2 and src(recs[1], 0) == "Calculate 4 + 4."
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(rows) == 4 and sum(r["fallback"] for r in rows) == 2
    again = ModelParaphrases(sampler=ScriptedRewriter(), cache=str(cache))  # a new run reads the cache
    again.prepare(recs, [1, 2])
    assert again.sampler.calls == [] and again(recs[1], 1) == "Work out 4 + 4, please."
    with pytest.raises(ValueError, match="prompt_condition.model is not set"):
        ModelParaphrases()


def test_model_source_with_a_real_model_on_the_paraphrase_set(tmp_path):
    """The tiny random model writes no usable rewrite: every variant falls back, and the cache records it."""
    from omegaconf import OmegaConf

    from rlexp.algorithms.prompt_conditions.paraphrases import ParaphraseSet
    from rlexp.config.paths import CONF_DIR

    model = OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml")
    cond = ParaphraseSet(
        k=2, source="model", model=model, cache=str(tmp_path / "c.jsonl"), rewrite={"max_new_tokens": 4}
    )
    recs = [{"id": "a", "question": "Calculate 2 + 3."}]
    cond.prepare(recs, cond.values(2))
    assert cond.question("Calculate 2 + 3.", 1.0, recs[0]) != "Calculate 2 + 3."
    assert cond.source.fallbacks == 1 and len((tmp_path / "c.jsonl").read_text().splitlines()) == 1
