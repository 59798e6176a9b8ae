"""Replay (``rlexp replay <run_dir>``): upload to MLflow the metrics of a run that its tracking server never got.

Every step of a run is in ``<run_dir>/metrics.jsonl``. When the server was away for longer than the
trainer's flush timeout (or at start), the rest of the run is only there. Replay reads the run's
MLflow run id (``tracker_ids.json``) and tracking URI (``config.yaml``, or ``--tracking-uri``),
and logs exactly the (metric, step) values the MLflow run does not hold yet — running it twice logs
nothing the second time. A run that never reached MLflow (server down at start, or a different
server given by ``--tracking-uri``) is created with the run's params, tags and config artifacts,
and its id is written to ``tracker_ids.json`` so a resumed run continues it. The run's final
``provenance.json`` is uploaded again (the run's own upload of it may have been left unsent).

A store that cannot be reached is one line (``TrackingUnreachable``): a URI from the run's config suggests
``--tracking-uri``; so does a SQLite store from the config that does not exist here (a relative path run
from another directory), rather than creating an empty one. A SQLite store is opened as a run opens it
(``open_client``: checked, repaired or refused).
"""

from __future__ import annotations

import json
import re
from pathlib import Path


class TrackingUnreachable(ConnectionError):
    """The tracking store of a replay cannot be reached; the message is one line that says what to do."""


def connection_reason(exc: BaseException) -> str:
    """The short cause of a failed connection (``Connection refused``, ``Name or service not known``, ...)."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if m:
        return m.group(1).strip()
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "timed out"
    return (text.splitlines() or [type(exc).__name__])[0][:200]


def _check_reachable(client, uri: str, source: str, run_dir: Path) -> None:
    """One request to the store before anything is uploaded: a dead URI is one line that suggests
    ``--tracking-uri`` (a URI from the run's config) or checking it (one given on the command line)."""
    from rlexp.tracking.mlflow_tracker import is_permanent

    try:
        client.search_experiments(max_results=1)
    except Exception as e:
        if is_permanent(e):
            raise
        hint = (
            "start it again, or upload to another store with --tracking-uri URI"
            if source == "config"
            else "check that it runs and that the URI is right"
        )
        where = f"saved in {run_dir / 'config.yaml'}" if source == "config" else "--tracking-uri"
        raise TrackingUnreachable(
            f"rlexp replay: cannot reach the MLflow tracking server at {uri} ({where}): {connection_reason(e)}; {hint}"
        ) from e


def _mlflow_settings(cfg, tracking_uri: str | None, experiment: str | None) -> tuple[str, str, str | None]:
    backend = ((cfg.get("tracker") or {}).get("backends") or {}).get("mlflow") or {}
    uri = tracking_uri or backend.get("tracking_uri")
    if not uri:
        raise SystemExit(
            "rlexp replay: the run's config has no tracker.backends.mlflow.tracking_uri; pass --tracking-uri"
        )
    exp = experiment or backend.get("experiment") or cfg.get("experiment_name") or "rlexp"
    return uri, exp, backend.get("artifact_location")


def replay(
    run_dir: str | Path, tracking_uri: str | None = None, experiment: str | None = None, dry_run: bool = False
) -> dict:
    """Upload the missing metrics of ``run_dir``; return a summary dict (run_id, uploaded, present,
    steps, created)."""
    from mlflow.exceptions import MlflowException
    from omegaconf import OmegaConf

    from rlexp.tracking.base import read_jsonl
    from rlexp.tracking.mlflow_tracker import (
        bound_http_waits,
        create_run,
        experiment_id,
        log_metric_entities,
        missing_metrics,
        open_client,
        sqlite_path,
    )
    from rlexp.tracking.provenance import run_tags

    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"rlexp replay: {run_dir}/metrics.jsonl not found (is {run_dir} a run directory?)")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    uri, exp_name, artifact_location = _mlflow_settings(cfg, tracking_uri, experiment)
    source = "flag" if tracking_uri else "config"
    db = sqlite_path(uri)
    if db is not None and source == "config" and not db.exists():
        raise FileNotFoundError(
            f"rlexp replay: the MLflow store {uri} saved in {run_dir / 'config.yaml'} does not exist here "
            f"({db.absolute()}); run from the directory the run started in, or pass --tracking-uri URI (a new "
            "SQLite store is created there)"
        )
    if uri.startswith(("http://", "https://")):
        bound_http_waits()
    client = open_client(uri)
    _check_reachable(client, uri, source, run_dir)
    ids_path = run_dir / "tracker_ids.json"
    ids = json.loads(ids_path.read_text()) if ids_path.exists() else {}
    ids = ids if isinstance(ids, dict) else {}
    run_id = ids.get("mlflow")
    if run_id:
        try:
            client.get_run(run_id)
        except MlflowException as e:
            if getattr(e, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            run_id = None  # not on this server: create it here
    prov_path = run_dir / "provenance.json"
    prov = json.loads(prov_path.read_text()) if prov_path.exists() else {}
    rows = read_jsonl(run_dir / "metrics.jsonl")
    created = False
    if run_id is None:
        if dry_run:
            steps = sorted({int(r["step"]) for r in rows})
            return {
                "run_id": None,
                "uploaded": sum(len(r) - 2 for r in rows),
                "present": 0,
                "steps": steps,
                "created": True,
                "tracking_uri": uri,
            }
        from rlexp.tracking.params import flatten

        container = OmegaConf.to_container(cfg, resolve=True)
        tags = run_tags(cfg, prov, run_dir) if prov else {"run_dir": str(run_dir.resolve())}
        tags["replayed"] = "true"
        exp_id = experiment_id(client, exp_name, artifact_location)
        run_id = create_run(client, exp_id, cfg.get("run_name") or run_dir.name, flatten(container), tags)
        for name in ("config.yaml", "overrides.yaml", "provenance.json"):
            if (run_dir / name).exists():
                client.log_artifact(run_id, str(run_dir / name))
        ids["mlflow"] = run_id
        ids_path.write_text(json.dumps(ids))
        created = True
    missing = missing_metrics(client, run_id, rows)
    total = sum(1 for r in rows for k, v in r.items() if k not in ("step", "time") and v is not None)
    if not dry_run:
        log_metric_entities(client, run_id, missing)
        if prov_path.exists() and not created:  # the final provenance (the run's upload may not have reached it)
            client.log_artifact(run_id, str(prov_path))
        status = prov.get("status")
        if status in ("FINISHED", "FAILED", "KILLED") and client.get_run(run_id).info.status != status:
            if prov.get("end_time"):
                client.set_tag(run_id, "end_time", prov["end_time"])
            client.set_terminated(run_id, status=status)
    return {
        "run_id": run_id,
        "uploaded": len(missing),
        "present": total - len(missing),
        "steps": sorted({m.step for m in missing}),
        "created": created,
        "tracking_uri": uri,
    }
