"""Which distribution of a training mixture a record comes from (a reasoning-gym task, a difficulty level): what
curricula schedule over (``sampler=dump``) and what the held-out accuracy is broken down by (``eval.by``)."""

from __future__ import annotations


def distribution_of(record: dict, key: str | list[str] = "source_dataset") -> str:
    """The distribution a record belongs to: ``metadata[key]`` (reasoning-gym's ``source_dataset``: the task of a
    mixture; ``difficulty``: the generator's difficulty settings), else ``record[key]``, else ``"all"``. A list of
    keys joins their values with ``/`` (``[source_dataset, difficulty]``: task × difficulty)."""
    meta = record.get("metadata") or {}
    keys = [key] if isinstance(key, str) else list(key)
    values = [meta.get(k, record.get(k)) for k in keys]
    if all(v is None for v in values):
        return "all"
    return "/".join(_compact(v) for v in values)


def _compact(value) -> str:
    if isinstance(value, dict):  # reasoning-gym's difficulty: {"num_terms": [2, 2], "num_digits": [1, 2]}
        return ",".join(f"{k}={_compact(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list | tuple):
        return "-".join(_compact(v) for v in value)
    return str(value)
