"""Weights & Biases tracker: offline unless an API key is configured (``WANDB_API_KEY`` or
``tracker.mode=online``). The offline run directory (``<run_dir>/wandb/offline-run-*``) can be
synced later with ``wandb sync``; ``read_offline_run`` reads one back (config and history).

W&B tags are short (64 characters at most), so only the identity tags (algorithm, dataset, model,
benchmark, seed, sweep, trial) become W&B tags; every tag, provenance included, is in the run's
config under ``rlexp_tags``."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from rlexp.tracking.base import Tracker

IDENTITY_TAGS = ("algorithm", "dataset", "model", "benchmark", "seed", "sweep", "trial")
MAX_WANDB_TAG = 64


def _short_tags(tags: dict) -> list[str]:
    out = [f"{k}={tags[k]}" for k in IDENTITY_TAGS if k in tags and str(tags[k]) not in ("", "none")]
    return [t for t in out if len(t) <= MAX_WANDB_TAG]


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, project: str = "rlexp", entity: str | None = None, mode: str | None = None, dir: str = "."):
        self.project, self.entity, self.dir = project, entity, dir
        self.mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = None
        self.run_id = self.url = self.files_dir = None

    def start(self, run_name, config, params, tags, resume_id=None):
        import wandb

        os.makedirs(self.dir, exist_ok=True)
        self.run = wandb.init(
            project=self.project,
            entity=self.entity,
            mode=self.mode,
            dir=self.dir,
            name=run_name,
            config={**config, "rlexp_tags": dict(tags)},
            tags=_short_tags(tags),
            id=resume_id,
            resume="allow" if resume_id else None,
            settings=wandb.Settings(silent=True),
        )
        self.run_id, self.url, self.files_dir = self.run.id, getattr(self.run, "url", None), self.run.dir
        return self.run.id

    def describe(self):
        if self.run_id is None:
            return []
        if self.mode == "online" and self.url:
            return [{"tracker": "wandb", "run_id": self.run_id, "where": self.url, "open": self.url}]
        run_dir = os.path.dirname(self.files_dir) if self.files_dir else self.dir
        return [{"tracker": "wandb", "run_id": self.run_id, "where": run_dir, "open": f"wandb sync {run_dir}"}]

    def log_metrics(self, metrics, step):
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path, artifact_path=None):
        self.run.save(str(path), base_path=os.path.dirname(str(path)), policy="now")

    def set_tags(self, tags):
        self.run.config.update(
            {"rlexp_tags": {**dict(self.run.config.get("rlexp_tags") or {}), **tags}}, allow_val_change=True
        )

    def finish(self, status="FINISHED"):
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)
            self.run = None


# ---- reading an offline run back ---------------------------------------------------------------
# A ``.wandb`` file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
# 32 KiB blocks of records, each with a 7-byte header (crc32 u32, length u16, type u8: 1 full,
# 2 first, 3 middle, 4 last) whose payloads concatenate to serialized ``wandb_internal_pb2.Record``s.
_HEADER = 7
_BLOCK = 32768


def iter_records(path: str | Path):
    """Yield the protobuf ``Record`` objects of a ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (header {data[:4]!r})")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind in (1, 2):
            pending = chunk
        else:
            pending += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            pending = b""
            yield rec


def read_offline_run(run_dir: str | Path) -> dict:
    """Config, history rows (``{"_step": s, key: value}``), summary and tags of the newest offline W&B
    run under ``run_dir`` (``<run_dir>/wandb/offline-run-*/run-*.wandb``)."""
    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no offline W&B run under {run_dir}/wandb")
    config: dict = {}
    history: dict[int, dict] = {}
    summary: dict = {}
    tags: list[str] = []
    run_id = None
    for rec in iter_records(files[-1]):
        which = rec.WhichOneof("record_type")
        if which == "run":
            run_id = rec.run.run_id
            tags = list(rec.run.tags)
            for item in rec.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif which == "config":
            for item in rec.config.update:
                config[item.key] = json.loads(item.value_json)
        elif which == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            step = int(row.get("_step", rec.history.step.num))
            history.setdefault(step, {}).update(row)
        elif which == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    config.pop("_wandb", None)
    return {
        "id": run_id,
        "config": config,
        "history": [history[s] for s in sorted(history)],
        "summary": summary,
        "tags": tags,
        "file": str(files[-1]),
    }
