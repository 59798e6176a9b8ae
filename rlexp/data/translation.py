"""Translation pairs as training records (issue 28: the dictionary-tool translation of "Improving Low-Resource
Translation with Dictionary-Guided Fine-Tuning and RL: A Spanish-to-Wayuunaiki Study", 2025, arXiv 2508.19481).

A record's question asks for the translation of one source sentence (``template``), its answer is the reference
translation (what ``rlexp.rewards.translation.TranslationBLEU`` scores against). The pairs come from a local file in
the paper's data schema — each pair a source sentence and its target:

* ``path``: a ``.jsonl`` (or ``.json``, ``.csv``, ``.parquet``) file with the columns ``source_column`` and
  ``target_column`` (default ``source``, ``target``);
* or ``source_file`` + ``target_file``: two line-aligned plain-text files, one sentence a line (the AmericasNLP
  shared task's release: ``dev.es`` and ``dev.guc``).

The default ``pkg:rlexp/data/translation_es_en.jsonl`` is a 12-pair Spanish→English sample for tests and
demonstrations; the AmericasNLP 2025 Spanish–Wayuunaiki data are not downloadable here — point ``dataset.path`` (or
the two files) at a local copy and set ``dataset.target_language=Wayuunaiki``."""

from __future__ import annotations

from rlexp.data.sources import DatasetSplits, _split, cell_text, load_table, package_file

SAMPLE = "pkg:rlexp/data/translation_es_en.jsonl"
TEMPLATE = "Translate this {source_language} sentence into {target_language}:\n{source}"


def _line_pairs(source_file: str, target_file: str) -> list[dict]:
    src, tgt = package_file(source_file), package_file(target_file)
    for name, p in (("source_file", src), ("target_file", tgt)):
        if not p.is_file():
            raise FileNotFoundError(f"dataset.{name}: no file at {p}")
    a = src.read_text(encoding="utf-8").splitlines()
    b = tgt.read_text(encoding="utf-8").splitlines()
    if len(a) != len(b):
        raise ValueError(
            f"dataset.source_file ({len(a)} lines) and dataset.target_file ({len(b)} lines) are not line-aligned"
        )
    return [{"source": s, "target": t} for s, t in zip(a, b) if s.strip() or t.strip()]


def translation_pairs(
    seed: int,
    path: str | None = SAMPLE,
    source_file: str | None = None,
    target_file: str | None = None,
    name: str = "translation",
    source_column: str = "source",
    target_column: str = "target",
    source_language: str = "Spanish",
    target_language: str = "English",
    template: str = TEMPLATE,
    eval_size: int = 4,
    train_size: int | None = None,
) -> DatasetSplits:
    """The translation records (module doc): one per pair, ``question`` the filled ``template`` (``{source}``,
    ``{source_language}``, ``{target_language}``), ``answer`` the reference, ``scorer`` exact."""
    if (source_file is None) != (target_file is None):
        raise ValueError("dataset.source_file and dataset.target_file go together (two line-aligned text files)")
    if "{source}" not in template:
        raise ValueError(f"dataset.template must contain '{{source}}', got {template!r}")
    if source_file is not None:
        rows, where = _line_pairs(source_file, target_file), f"dataset.source_file={source_file}"
        source_column, target_column = "source", "target"
    elif path:
        rows, where = load_table(path), f"dataset.path={path}"
    else:
        raise ValueError("dataset.path (or dataset.source_file and dataset.target_file) is not set")
    if not rows:
        raise ValueError(f"{where}: no translation pairs")
    records = []
    for i, row in enumerate(rows):
        for column in (source_column, target_column):
            if column not in row:
                raise ValueError(f"{where}: row {i + 1} has no column {column!r} (columns: {sorted(row)})")
        source = cell_text(row, source_column, where, i, numbers=False)
        target = cell_text(row, target_column, where, i, numbers=False)
        question = template.format(source=source, source_language=source_language, target_language=target_language)
        records.append(
            {
                "id": f"{name}-{i}",
                "question": question,
                "answer": target,
                "scorer": "exact",
                "metadata": {
                    "source": where,  # where the row is, for messages (data.lengths.where)
                    "row": i + 1,
                    "source_text": source,
                    "source_language": source_language,
                    "target_language": target_language,
                },
            }
        )
    return _split(name, records, eval_size, seed, train_size)
