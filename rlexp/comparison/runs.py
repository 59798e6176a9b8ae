"""Runs to compare, from MLflow (tags, filters) or from run directories (metrics.jsonl): identity tags, params
and per-step metric histories."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_METRICS = (
    r"reward/mean",
    r"accuracy",
    r"eval/(.+/)?accuracy",
    r"entropy/mean",
    r"length/mean",
    r"(.+/)?consistency/\w*(rate|mean)",
    r"(.+/)?consistency_rate",
    r"(.+/)?pass_at_\d+",
)
DEFAULT_GROUP_BY = ("algorithm", "dataset", "model", "benchmark")


@dataclass
class RunRecord:
    """One run: its id, display name, where it came from, tags, params and metric histories
    (``{metric: [(step, value), ...]}`` sorted by step)."""

    run_id: str
    name: str
    source: str
    tags: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    history: dict = field(default_factory=dict)

    def attr(self, key: str) -> str:
        if key.startswith("params."):
            return str(self.params.get(key[len("params.") :], "?"))
        return str(self.tags.get(key[len("tags.") :] if key.startswith("tags.") else key, "?"))


# ---- selecting runs ------------------------------------------------------------------------------
def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlruns.db'}"


def mlflow_filter(filter_string: str | None, tags: dict[str, str]) -> str:
    """An MLflow search filter from a raw filter and ``key=value`` tag conditions."""
    parts = [f"({filter_string})"] if filter_string else []
    for k, v in tags.items():
        parts.append(f"tags.`{k}` = '{v}'")
    return " and ".join(parts)


def mlflow_runs(
    tracking_uri: str,
    experiments: list[str] | None = None,
    filter_string: str | None = None,
    tags: dict[str, str] | None = None,
    metrics: list[str] | None = None,
    max_runs: int = 1000,
) -> list[RunRecord]:
    """Runs of the named experiments (default: all) matching the filter, with the histories of the
    metrics matching ``metrics`` (names or regular expressions; default ``DEFAULT_METRICS``)."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    if tracking_uri.startswith(("http://", "https://")):
        from rlexp.tracking.mlflow_tracker import bound_http_waits

        bound_http_waits()
    client = MlflowClient(tracking_uri=tracking_uri)
    if experiments:
        ids = []
        for name in experiments:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise SystemExit(f"rlexp compare: --experiment {name!r} not found at {tracking_uri}")
            ids.append(exp.experiment_id)
    else:
        ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not ids:
        return []
    found = client.search_runs(
        ids,
        filter_string=mlflow_filter(filter_string, tags or {}),
        max_results=max_runs,
        order_by=["attributes.start_time ASC"],
    )
    patterns = compile_patterns(metrics)
    out = []
    for r in found:
        keys = [k for k in r.data.metrics if matches(k, patterns)]
        hist = {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k)) for k in keys}
        out.append(
            RunRecord(
                r.info.run_id,
                r.info.run_name or r.info.run_id,
                f"mlflow:{tracking_uri}",
                dict(r.data.tags),
                dict(r.data.params),
                hist,
            )
        )
    return out


def local_runs(paths: list[str | Path], metrics: list[str] | None = None) -> list[RunRecord]:
    """Runs from run directories: every ``metrics.jsonl`` at or below each path, with the tags the
    run's ``config.yaml`` and ``provenance.json`` give."""
    import json

    from omegaconf import OmegaConf

    from rlexp.tracking.base import read_jsonl
    from rlexp.tracking.provenance import benchmark_name, run_tags

    patterns = compile_patterns(metrics)
    out, seen = [], set()
    for root in paths:
        root = Path(root)
        files = [root / "metrics.jsonl"] if (root / "metrics.jsonl").exists() else sorted(root.rglob("metrics.jsonl"))
        if not files:
            raise SystemExit(f"rlexp compare: no metrics.jsonl at or below {root}")
        for f in files:
            d = f.parent
            if d.resolve() in seen:  # the same run reached twice (outputs/latest, overlapping --runs)
                continue
            seen.add(d.resolve())
            tags, params = {"run_dir": str(d.resolve())}, {}
            if (d / "config.yaml").exists():
                from rlexp.tracking.params import flatten

                cfg = OmegaConf.load(d / "config.yaml")
                params = flatten(OmegaConf.to_container(cfg, resolve=False))
                if (d / "provenance.json").exists():
                    tags = run_tags(cfg, json.loads((d / "provenance.json").read_text()), d)
                else:
                    tags.update(
                        algorithm=cfg.algorithm.name,
                        dataset=cfg.dataset.name,
                        model=cfg.model.name,
                        benchmark=benchmark_name(cfg),
                        seed=str(cfg.trainer.seed),
                    )
            hist: dict[str, list] = {}
            for row in read_jsonl(f):
                for k, v in row.items():
                    if k not in ("step", "time") and v is not None and matches(k, patterns):
                        hist.setdefault(k, []).append((int(row["step"]), float(v)))
            hist = {k: sorted(dict(v).items()) for k, v in hist.items()}  # a step logged twice counts once
            name = tags.get("mlflow.runName") or d.name
            out.append(RunRecord(str(d), name, "local", tags, params, hist))
    return out


def compile_patterns(metrics: list[str] | None) -> list[re.Pattern]:
    return [re.compile(m) for m in (metrics or DEFAULT_METRICS)]


def matches(key: str, patterns: list[re.Pattern]) -> bool:
    return any(p.fullmatch(key) for p in patterns)
