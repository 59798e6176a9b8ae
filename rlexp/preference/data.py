"""Preference data for the TRL-backed methods, read through the column paths of ``rlexp.data.hub`` (the same
reader for local files and hub sets: ``read_rows``, ``hub_rows``, the path language of ``dataset.columns``).

Two schemas (``dataset.schema``):

* ``paired``: ``prompt`` (optional), ``chosen``, ``rejected`` — each text, or a list of chat messages
  (``{"role", "content"}``). Without a prompt column, or when chosen/rejected hold the whole conversation
  (UltraFeedback-binarized's message lists, HH-RLHF's ``"\\n\\nHuman: … \\n\\nAssistant: …"`` text), the prompt is
  the part chosen and rejected share: for messages the common leading turns, for text up to the end of the last
  ``"\\n\\nAssistant:"`` both share (HH-RLHF), else the common prefix (TRL's ``extract_prompt``).
* ``unpaired``: ``prompt``, ``completion``, ``label`` (true: desirable) — KTO's schema.

``PreferenceData.rows(kind)`` gives TRL's columns: ``paired`` -> {prompt, chosen, rejected}; ``unpaired`` ->
{prompt, completion, label} (a pair becomes its chosen with label true and its rejected with label false, TRL's
``unpair_preference_dataset``); ``prompts`` -> {prompt} (online DPO). Unpaired data cannot be paired: refused.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from rlexp.config.schema import ConfigError
from rlexp.data.hub import Rows, _container, _Missing, hub_rows, parse_path, read_rows, resolve

SCHEMAS = {"paired": ("prompt", "chosen", "rejected"), "unpaired": ("prompt", "completion", "label")}
KINDS = ("paired", "unpaired", "prompts")
ASSISTANT = "\n\nAssistant:"


@dataclass
class PreferenceData:
    name: str
    schema: str  # paired | unpaired
    train: list[dict]
    eval: list[dict]

    def rows(self, kind: str, split: str = "train") -> list[dict]:
        rows = self.train if split == "train" else self.eval
        if kind == "prompts":
            seen, out = set(), []
            for r in rows:
                key = repr(r["prompt"])
                if key not in seen:
                    seen.add(key)
                    out.append({"prompt": r["prompt"]})
            return out
        if kind == self.schema:
            return [dict(r) for r in rows]
        if kind == "unpaired":
            out = []
            for r in rows:
                out.append({"prompt": r["prompt"], "completion": r["chosen"], "label": True})
                out.append({"prompt": r["prompt"], "completion": r["rejected"], "label": False})
            return out
        raise ConfigError(
            f"dataset {self.name} is unpaired (prompt/completion/label); this method needs chosen/rejected pairs "
            "(dataset.schema=paired), or use algorithm=kto"
        )


def _is_messages(v) -> bool:
    return isinstance(v, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in v)


def split_prompt(chosen, rejected):
    """(prompt, chosen, rejected) of a pair whose prompt is inside both (module docstring)."""
    if _is_messages(chosen) and _is_messages(rejected):
        n = 0
        while n < min(len(chosen), len(rejected)) - 1 and dict(chosen[n]) == dict(rejected[n]):
            n += 1
        return list(chosen[:n]), list(chosen[n:]), list(rejected[n:])
    if isinstance(chosen, str) and isinstance(rejected, str):
        cut = chosen.rfind(ASSISTANT)
        if cut >= 0 and rejected[: cut + len(ASSISTANT)] == chosen[: cut + len(ASSISTANT)]:
            cut += len(ASSISTANT)
        else:
            from trl.data_utils import extract_prompt

            p = extract_prompt({"chosen": chosen, "rejected": rejected})
            return p["prompt"], p["chosen"], p["rejected"]
        return chosen[:cut], chosen[cut:], rejected[cut:]
    raise ValueError("chosen and rejected must both be text or both be lists of chat messages")


def _value(row, path: str, tokens, where: str, key: str, required: bool = True):
    try:
        return resolve(row, path, tokens)
    except _Missing:
        if required:
            raise ConfigError(f"{where}: no value at dataset.columns.{key}={path!r}") from None
        return None


def _record(row, schema: str, paths: dict, where: str) -> dict:
    if schema == "unpaired":
        label = _value(row, *paths["label"], where, "label")
        if isinstance(label, str) and label.lower() in ("true", "false"):
            label = label.lower() == "true"
        if not isinstance(label, (bool, int)):
            raise ConfigError(f"{where}: dataset.columns.label must be true/false, got {label!r}")
        return {
            "prompt": _value(row, *paths["prompt"], where, "prompt"),
            "completion": _value(row, *paths["completion"], where, "completion"),
            "label": bool(label),
        }
    chosen = _value(row, *paths["chosen"], where, "chosen")
    rejected = _value(row, *paths["rejected"], where, "rejected")
    prompt = _value(row, *paths["prompt"], where, "prompt", required=False) if "prompt" in paths else None
    whole = prompt is None or (_is_messages(chosen) and not _is_messages(prompt))
    if not whole and isinstance(prompt, str) and isinstance(chosen, str) and chosen.startswith(prompt):
        whole = True  # a text prompt repeated inside chosen/rejected
    if whole:
        try:
            prompt, chosen, rejected = split_prompt(chosen, rejected)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if not prompt or not chosen or not rejected:
        raise ConfigError(f"{where}: empty prompt, chosen or rejected (after splitting off the shared prompt)")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def preference_dataset(
    seed: int,
    name: str = "preference",
    schema: str = "paired",
    columns: Mapping | None = None,
    path: str | None = None,
    hub: Mapping | None = None,
    max_rows: int | None = None,
    eval_size: int = 8,
    train_size: int | None = None,
    eval_split: Mapping | None = None,
) -> PreferenceData:
    """Preference rows from ``path`` (a local .jsonl/.json/.parquet/.csv in the set's own schema: first choice),
    else ``hub`` ({path, subset, split}); the eval split is ``eval_split`` (a hub split, e.g. test_prefs) or
    ``eval_size`` rows held out under ``seed``."""
    if schema not in SCHEMAS:
        raise ConfigError(f"dataset.schema={schema!r}: one of {list(SCHEMAS)}")
    columns = _container(columns) or {k: k for k in SCHEMAS[schema]}
    needed = [k for k in SCHEMAS[schema] if not (schema == "paired" and k == "prompt")]
    missing = [k for k in needed if k not in columns]
    if missing:
        raise ConfigError(f"dataset.columns: {missing} missing for dataset.schema={schema} (needs {needed})")
    paths = {k: (str(v), parse_path(str(v), f"dataset.columns.{k}")) for k, v in columns.items() if v is not None}
    hub = _container(hub) or {}
    if path:
        rows = read_rows(str(path))
    elif hub.get("path"):
        rows = hub_rows(hub, max_rows)
    else:
        raise ConfigError(f"dataset {name}: no data — set dataset.path=<local file> (or dataset.hub.path)")

    def records(rs: Rows) -> list[dict]:
        n = len(rs.rows) if not max_rows else min(len(rs.rows), int(max_rows))
        return [_record(rs.rows[i], schema, paths, rs.where(i)) for i in range(n)]

    train = records(rows)
    if not train:
        raise ConfigError(f"{rows.source}: no rows")
    eval_split = _container(eval_split) or {}
    if eval_split.get("split") and not path:
        ev = records(hub_rows({**hub, **eval_split}, max_rows))[:eval_size]
    else:
        if eval_size >= len(train):
            raise ConfigError(f"dataset {name}: eval_size={eval_size} leaves no training rows ({len(train)} rows)")
        order = list(range(len(train)))
        random.Random(seed).shuffle(order)
        ev = [train[i] for i in order[:eval_size]]
        train = [train[i] for i in order[eval_size:]]
    return PreferenceData(name, schema, train[:train_size] if train_size else train, ev)
