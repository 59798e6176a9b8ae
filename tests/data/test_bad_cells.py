"""A null, list or dict cell in a dataset's question/answer column is refused in one line naming the file, the
row and the column, instead of being trained on as the text "None" or "['What is', 3]" (issue 16)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlexp.config.schema import ConfigError
from rlexp.data.sources import gsm8k, local_file

GOOD = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]


def _jsonl(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"question": None, "answer": "2"}, "column 'question' is null"),
        (
            {"question": ["What is", 3], "answer": "2"},
            "column 'question' is a list (['What is', 3]), expected a string",
        ),
        (
            {"question": {"text": "1+1"}, "answer": "2"},
            "column 'question' is a dict (object) ({'text': '1+1'}), expected a string",
        ),
        ({"question": "1+1", "answer": None}, "column 'answer' is null"),
        ({"question": "1+1", "answer": [2]}, "column 'answer' is a list ([2]), expected a string or a number"),
        ({"question": "   ", "answer": "2"}, "column 'question' is blank"),
        ({"question": 7, "answer": "2"}, "column 'question' is of type int (7), expected a string"),
    ],
)
def test_bad_jsonl_cell_names_file_row_and_column(tmp_path, bad, message):
    path = _jsonl(tmp_path, [*GOOD[:2], bad, *GOOD[2:]])
    with pytest.raises(ConfigError) as e:
        local_file(path, seed=0, eval_size=1)
    assert str(e.value) == f"dataset.path={path} row 3: {message}"


def test_numeric_answers_are_kept_as_their_text(tmp_path):
    path = _jsonl(tmp_path, [{"question": "1+1", "answer": 2}, {"question": "half", "answer": 0.5}, *GOOD])
    splits = local_file(path, seed=0, eval_size=1)
    answers = {r["question"]: r["answer"] for r in splits.train + splits.eval}
    assert answers["1+1"] == "2" and answers["half"] == "0.5"


def test_null_cell_in_parquet_names_the_row(tmp_path):
    path = tmp_path / "d.parquet"
    table = pa.table(
        {
            "problem": ["What is 1 + 1?", "What is 2 + 2?", None, "What is 4 + 4?"],
            "solution": ["2", "4", "6", "8"],
        }
    )
    pq.write_table(table, path)
    with pytest.raises(ConfigError, match=rf"^dataset\.path={path} row 3: column 'problem' is null$"):
        local_file(str(path), seed=0, eval_size=1, question_column="problem", answer_column="solution")


def test_list_cell_in_parquet_names_the_row(tmp_path):
    path = tmp_path / "d.parquet"
    table = pa.table({"question": [["What is", "3"], ["a"], ["b"]], "answer": ["1", "2", "3"]})
    pq.write_table(table, path)
    with pytest.raises(ConfigError, match=r"row 1: column 'question' is a list \(\['What is', '3'\]\)"):
        local_file(str(path), seed=0, eval_size=1)


def test_empty_csv_cell_names_the_row(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("question,answer\nWhat is 1 + 1?,2\nWhat is 2 + 2?,\nWhat is 3 + 3?,6\n")
    with pytest.raises(ConfigError, match=r"row 2: column 'answer' is null"):
        local_file(str(path), seed=0, eval_size=1)


def test_gsm8k_null_question_names_the_file_and_row(tmp_path):
    rows = [{"question": "q1", "answer": "x #### 1"}, {"question": None, "answer": "y #### 2"}]
    path = _jsonl(tmp_path, rows)
    with pytest.raises(ConfigError, match=rf"^dataset\.data_files={path} row 2: column 'question' is null$"):
        gsm8k(seed=0, data_files=path, eval_size=1)


def test_training_on_a_null_cell_stops_before_the_model_loads(tiny_cfg, tmp_path, monkeypatch):
    import rlexp.models.loading as loading

    path = _jsonl(tmp_path, [*GOOD, {"question": "What is 9 + 9?", "answer": None}])

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_model)
    cfg = tiny_cfg("dataset=local", f"dataset.path={path}", "dataset.eval_size=1")
    from rlexp.runs.training import run

    with pytest.raises(ConfigError) as e:
        run(cfg)
    assert str(e.value) == f"dataset: dataset.path={path} row 5: column 'answer' is null"
