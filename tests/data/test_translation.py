"""Translation pairs as records (rlexp/data/translation.py): the shipped sample, a JSONL in the source/target schema,
two line-aligned text files (the AmericasNLP release), and the errors that name the file and row."""

from __future__ import annotations

import pytest

from rlexp.data.translation import translation_pairs


def test_the_shipped_sample_makes_translation_records():
    splits = translation_pairs(seed=0)
    assert (len(splits.train), len(splits.eval)) == (8, 4)
    rec = next(r for r in splits.train + splits.eval if r["metadata"]["source_text"] == "El perro come pan.")
    assert rec["question"] == "Translate this Spanish sentence into English:\nEl perro come pan."
    assert rec["answer"] == "The dog eats bread." and rec["scorer"] == "exact"
    assert rec["metadata"]["row"] == 2 and rec["metadata"]["source"].endswith("translation_es_en.jsonl")


def test_a_jsonl_and_line_aligned_files(tmp_path):
    path = tmp_path / "es_guc.jsonl"
    path.write_text('{"es": "Hola", "guc": "Jamaya"}\n{"es": "Agua", "guc": "Wüin"}\n')
    splits = translation_pairs(
        seed=0, path=str(path), source_column="es", target_column="guc", target_language="Wayuunaiki", eval_size=1
    )
    records = sorted(splits.train + splits.eval, key=lambda r: r["metadata"]["row"])
    assert records[0]["question"] == "Translate this Spanish sentence into Wayuunaiki:\nHola"
    assert [r["answer"] for r in records] == ["Jamaya", "Wüin"]
    (tmp_path / "dev.es").write_text("uno\ndos\ntres\n")
    (tmp_path / "dev.en").write_text("one\ntwo\nthree\n")
    lines = translation_pairs(
        seed=0, source_file=str(tmp_path / "dev.es"), target_file=str(tmp_path / "dev.en"), eval_size=1
    )
    assert sorted(r["answer"] for r in lines.train + lines.eval) == ["one", "three", "two"]


def test_errors_name_the_setting_file_and_row(tmp_path):
    (tmp_path / "a.es").write_text("uno\ndos\n")
    (tmp_path / "a.en").write_text("one\n")
    with pytest.raises(ValueError, match="are not line-aligned"):
        translation_pairs(seed=0, source_file=str(tmp_path / "a.es"), target_file=str(tmp_path / "a.en"))
    with pytest.raises(ValueError, match="source_file and dataset.target_file go together"):
        translation_pairs(seed=0, source_file=str(tmp_path / "a.es"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "uno", "target": "one"}\n{"source": "dos"}\n{"source": "tres", "target": "three"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 2 has no column 'target'"):
        translation_pairs(seed=0, path=str(bad), eval_size=1)
    with pytest.raises(ValueError, match="dataset.template must contain"):
        translation_pairs(seed=0, template="Translate: {text}")
