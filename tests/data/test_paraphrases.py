"""Paraphrase sources (rlexp/data/paraphrases.py) and a local file's paraphrase columns."""

import json

import pytest

from rlexp.config.schema import ConfigError
from rlexp.data.paraphrases import RecordParaphrases, TemplateParaphrases, paraphrase_source, reworded
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
