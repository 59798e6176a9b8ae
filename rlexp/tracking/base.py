"""Tracker interface. Every run also writes ``metrics.jsonl`` (JSONLTracker) whatever else is on.

A tracker is started with ``resume_id`` (the id it returned on a previous start of the same run
directory) so a resumed run continues the same dashboard run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


class Tracker:
    name = "tracker"

    def start(self, run_name: str, config: dict, params: dict, tags: dict, resume_id: str | None = None) -> str | None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def backfill(self, rows: list[dict]) -> None:
        """Called when a run resumes, with every row of its ``metrics.jsonl``: log the (metric, step)
        values this tracker does not hold yet (a kill can land between the JSONL write and the
        tracker's), so no logged step is lost or duplicated. Default: nothing."""

    def finish(self, status: str = "FINISHED") -> None: ...

    def describe(self) -> list[dict[str, str]]:
        """Where this run went, for the end-of-run summary: ``tracker``, ``run_id``, ``where`` (store or URL),
        ``open`` (the command or URL that shows it). Empty when it went nowhere."""
        return []


class NoTracker(Tracker):
    name = "none"


class JSONLTracker(Tracker):
    """Appends one JSON object per logged step: {"step": s, "time": t, <metric>: value, ...}."""

    name = "jsonl"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def start(self, run_name, config, params, tags, resume_id=None):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.repair()
        return str(self.path)

    def repair(self) -> None:
        """Cut a torn last line (a run killed mid-write) so the next row starts on a line of its own."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def log_metrics(self, metrics, step):
        row = {"step": step, "time": time.time(), **{k: _num(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def last_step(self) -> int:
        return max((r["step"] for r in read_jsonl(self.path)), default=0)

    def has_step(self, step: int) -> bool:
        return any(r["step"] == step for r in read_jsonl(self.path))


def _num(v):
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a metrics log; a torn last line (a run killed mid-write) is ignored."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class MultiTracker(Tracker):
    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def start(self, run_name, config, params, tags, resume_id=None):
        ids = resume_id or {}
        return {t.name: t.start(run_name, config, params, tags, ids.get(t.name)) for t in self.trackers}

    def log_metrics(self, metrics, step):
        for t in self.trackers:
            t.log_metrics(metrics, step)

    def log_artifact(self, path, artifact_path=None):
        for t in self.trackers:
            t.log_artifact(path, artifact_path)

    def set_tags(self, tags):
        for t in self.trackers:
            t.set_tags(tags)

    def backfill(self, rows):
        for t in self.trackers:
            t.backfill(rows)

    def describe(self):
        return [d for t in self.trackers for d in t.describe()]

    def finish(self, status="FINISHED"):
        """Tag the end time, then finish every tracker."""
        from rlexp.tracking.provenance import now_iso

        self.set_tags({"end_time": now_iso()})
        for t in self.trackers:
            t.finish(status)
