"""MLflow tracker: a local SQLite store by default (``mlflow ui --backend-store-uri sqlite:///mlruns.db``),
or any tracking server by URI (``http://host:port``).

Training never waits on the tracking server. Creating a new run (``start`` must return its id) is
the only blocking call, bounded by ``start_timeout``; a resumed run's id is known, so it does not
wait at all. Everything else (metrics, tags, artifacts, status) goes through a queue that a
background thread sends in order. When the server is unreachable, the queue holds the operations
(in memory; ``metrics.jsonl`` has every metric on disk too) and the thread retries with a capped
backoff, so they are flushed when the server comes back. ``finish`` waits at most ``flush_timeout``
for the queue; whatever is still unsent then stays in ``metrics.jsonl`` and ``rlexp replay
<run_dir>`` uploads it (only the (metric, step) values the run does not hold yet, so nothing is
logged twice). A server that is down when a new run starts: training goes on without MLflow and
``rlexp replay`` creates the run later.

Every HTTP wait is bounded: ``MLFLOW_HTTP_REQUEST_TIMEOUT``/``_MAX_RETRIES``/``_BACKOFF_FACTOR``
are set to ``request_timeout``/``max_retries``/1 here instead of MLflow's 120 s / 7 retries / factor
2 (a value the user set in the environment wins). A very long outage keeps at most ``max_buffer``
operations in memory (older metric batches leave the buffer; ``rlexp replay`` recovers them).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from pathlib import Path

from rlexp.tracking.base import Tracker
from rlexp.tracking.sqlite_store import StoreError

log = logging.getLogger(__name__)

MAX_PARAM_LEN = 6000
MAX_KEY_LEN = 250
METRICS_PER_BATCH = 500

# MLflow error codes that no retry can fix (the op is dropped; metrics.jsonl still holds it)
PERMANENT_ERRORS = {
    "INVALID_PARAMETER_VALUE",
    "RESOURCE_DOES_NOT_EXIST",
    "RESOURCE_ALREADY_EXISTS",
    "BAD_REQUEST",
    "INVALID_STATE",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "MALFORMED_REQUEST",
}


_SET_BY_US: dict[str, str] = {}


def bound_http_waits(request_timeout: int = 5, max_retries: int = 1, backoff_factor: int = 1) -> None:
    """Set MLflow's HTTP timeout/retry variables to short values, unless the user set them (a value
    this function set earlier is the user's no more than ours: it is updated)."""
    wanted = {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(request_timeout)),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(int(max_retries)),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(int(backoff_factor)),
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    }
    for k, v in wanted.items():
        if k not in os.environ or os.environ[k] == _SET_BY_US.get(k):
            os.environ[k] = _SET_BY_US[k] = v


def is_permanent(exc: BaseException) -> bool:
    """True for an error the server answered (bad request, missing run), False for an outage."""
    code = getattr(exc, "error_code", None)
    return code in PERMANENT_ERRORS


def file_state(path: str) -> tuple[int, int] | None:
    """(modification time in ns, size) of a file, None when it is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def open_client(uri: str):
    """An ``MlflowClient`` whose store is ready. A SQLite store is created and migrated by the first client that
    opens it; runs starting at once on a fresh file would each migrate it and leave it half-migrated, so the first
    open happens under a file lock beside the database (``<db>.lock``), and the others find it migrated. Under
    the same lock the store is checked first (``rlexp.tracking.sqlite_store``): one behind this MLflow or left
    half-migrated by an interrupted migration is repaired and migrated after a backup copy where that is safe,
    otherwise refused with a ``StoreError`` that says how to recover."""
    from mlflow import MlflowClient

    db = sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    from filelock import FileLock

    from rlexp.tracking.sqlite_store import prepare_store

    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{db}.lock"):
        prepare_store(db)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # builds the store (creates / migrates the schema) now
    return client


def experiment_id(client, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location``) if missing. A local
    ``artifact_location`` applies to a local store only; on a tracking server the server's own
    artifact store is used (a path on this machine would be invisible to the server's UI)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    loc = None
    remote = client.tracking_uri.startswith(("http://", "https://"))
    if artifact_location and not (remote and "://" not in artifact_location):
        loc = artifact_location if "://" in artifact_location else Path(artifact_location).absolute().as_uri()
    try:
        return client.create_experiment(name, artifact_location=loc)
    except Exception:  # created concurrently by a sibling job of a multirun
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def param_entities(params: dict) -> list:
    """``Param`` entities with MLflow's key/value length limits applied."""
    from mlflow.entities import Param

    return [Param(k[:MAX_KEY_LEN], str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]


def log_params(client, run_id: str, params: list) -> None:
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i : i + 100])


def create_run(client, exp_id: str, run_name: str, params: dict, tags: dict) -> str:
    """Create a run with its tags and (truncated) params; return its id."""
    run = client.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()})
    log_params(client, run.info.run_id, param_entities(params))
    return run.info.run_id


def logged_steps(client, run_id: str, keys) -> dict[str, set[int]]:
    """For each metric key, the steps the run already holds."""
    return {k: {m.step for m in client.get_metric_history(run_id, k)} for k in keys}


def missing_metrics(client, run_id: str, rows: list[dict]):
    """``Metric`` entities for the (key, step) values of ``rows`` (metrics.jsonl rows) that the run
    does not hold yet; the timestamps are the rows' own."""
    from mlflow.entities import Metric

    keys = sorted({k for r in rows for k in r if k not in ("step", "time")})
    have = logged_steps(client, run_id, keys)
    out = []
    for r in rows:
        ts = int(float(r.get("time", time.time())) * 1000)
        for k, v in r.items():
            if k in ("step", "time") or v is None or int(r["step"]) in have[k]:
                continue
            out.append(Metric(k, float(v), ts, int(r["step"])))
            have[k].add(int(r["step"]))  # a duplicated JSONL row is still sent once
    return out


def log_metric_entities(client, run_id: str, metrics: list) -> None:
    for i in range(0, len(metrics), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + METRICS_PER_BATCH])


class MLflowTracker(Tracker):
    """See the module docstring. ``retry_interval`` is the first wait between retries while the server
    is away (doubling up to ``max_retry_interval``)."""

    name = "mlflow"

    def __init__(
        self,
        tracking_uri: str,
        experiment: str = "rlexp",
        artifact_location: str | None = None,
        request_timeout: int = 5,
        max_retries: int = 1,
        start_timeout: float = 60.0,
        flush_timeout: float = 30.0,
        retry_interval: float = 1.0,
        max_retry_interval: float = 15.0,
        max_buffer: int = 20000,
    ):
        self.tracking_uri, self.experiment, self.artifact_location = tracking_uri, experiment, artifact_location
        self.request_timeout, self.max_retries = request_timeout, max_retries
        self.start_timeout, self.flush_timeout = start_timeout, flush_timeout
        self.retry_interval, self.max_retry_interval = retry_interval, max_retry_interval
        self.max_buffer = max_buffer
        self._overflowed = False
        self.client = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.run_dir: str | None = None
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._closing = False
        self._abandon = False
        self._thread: threading.Thread | None = None
        self.outage_since: float | None = None
        self.sent_batches = 0
        self.dropped: list[tuple[str, str]] = []
        # artifact path -> its (mtime, size) as last sent / as the upload in flight reads it
        self._uploaded: dict[str, tuple[int, int] | None] = {}
        self._sending: dict[str, tuple[int, int] | None] = {}
        self._busy = False  # the operation at the head of the queue is being sent
        self._head_read = False  # that operation, an artifact upload, has read its file's state

    # ---- start (blocking, bounded) -------------------------------------------------------------
    def start(self, run_name, config, params, tags, resume_id=None):
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        if self.tracking_uri.startswith(("http://", "https://")):
            bound_http_waits(self.request_timeout, self.max_retries)
        self.run_dir = tags.get("run_dir")
        if resume_id:  # the run exists: nothing to wait for, marking it RUNNING again is queued like the rest
            self.client = open_client(self.tracking_uri)
            self.run_id = resume_id
            self._submit("resume")
            self._start_worker()
            return resume_id
        deadline, wait, last_error = time.monotonic() + self.start_timeout, self.retry_interval, None
        while True:
            try:  # one request creates the run (with its tags); the params follow through the queue
                self.client = self.client or open_client(self.tracking_uri)
                exp_id = self.experiment_id = experiment_id(self.client, self.experiment, self.artifact_location)
                self.run_id = self.client.create_run(
                    exp_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()}
                ).info.run_id
                break
            except StoreError:  # a local store refused (half-migrated, newer MLflow): no retry fixes it
                raise
            except Exception as e:
                if is_permanent(e) or time.monotonic() + wait > deadline:
                    last_error = e
                    break
                log.warning("MLflow at %s unreachable at start (%s); retrying in %.0f s", self.tracking_uri, e, wait)
                time.sleep(wait)
                wait = min(wait * 2, self.max_retry_interval)
        if self.run_id is None:
            log.error(
                "MLflow at %s: could not create the run (%s); training goes on without it, every metric is "
                "in metrics.jsonl: upload later with `rlexp replay %s`",
                self.tracking_uri,
                last_error,
                self.run_dir or "<run_dir>",
            )
            return None
        self._submit("params", param_entities(params))
        self._start_worker()
        return self.run_id

    def describe(self):
        if self.run_id is None:
            return []
        uri = self.tracking_uri
        remote = uri.startswith(("http://", "https://", "databricks"))
        base = uri.rstrip("/") if remote else "http://127.0.0.1:5000"
        exp = self.experiment_id
        if exp is None:
            try:  # a resumed run: one request for its experiment
                exp = self.client.get_run(self.run_id).info.experiment_id
            except Exception:
                exp = None
        url = f"{base}/#/experiments/{exp}/runs/{self.run_id}" if exp else base
        opener = url if remote else f"mlflow ui --backend-store-uri {uri}  # then {url}"
        return [{"tracker": "mlflow", "run_id": self.run_id, "where": uri, "open": opener}]

    def _start_worker(self) -> None:
        self._thread = threading.Thread(target=self._worker, name="mlflow-tracker", daemon=True)
        self._thread.start()

    # ---- queued operations ---------------------------------------------------------------------
    def _submit(self, kind: str, *args) -> None:
        if self.run_id is None:
            return
        with self._cv:
            self._queue.append((kind, args))
            if len(self._queue) > self.max_buffer:  # a long outage: keep memory bounded, replay recovers it
                idx = next((i for i, (k, _) in enumerate(self._queue) if k == "metrics" and i > 0), None)
                if idx is not None:
                    del self._queue[idx]
                    if not self._overflowed:
                        log.warning(
                            "MLflow buffer full (%d operations): dropping the oldest buffered metrics; "
                            "they are in metrics.jsonl (`rlexp replay %s`)",
                            self.max_buffer,
                            self.run_dir,
                        )
                    self._overflowed = True
            self._cv.notify_all()

    def log_metrics(self, metrics, step):
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, int(step)) for k, v in metrics.items() if v is not None and v == v]
        self._submit("metrics", items, step)

    def log_artifact(self, path, artifact_path=None):
        self._submit("artifact", str(path), artifact_path)

    def set_tags(self, tags):
        self._submit("tags", {k: str(v) for k, v in tags.items()})

    def backfill(self, rows):
        self._submit("backfill", list(rows))

    def pending(self) -> int:
        """Operations not sent yet."""
        with self._cv:
            return len(self._queue)

    def _apply(self, kind: str, args) -> None:
        c = self.client
        if kind == "metrics":
            log_metric_entities(c, self.run_id, args[0])
        elif kind == "artifact":
            path = os.path.abspath(args[0])
            with self._cv:  # what this upload reads, read under the lock final_provenance looks under
                state = file_state(path)
                self._sending[path] = state
                self._head_read = True
            try:
                c.log_artifact(self.run_id, args[0], args[1])
                self._uploaded[path] = state
            finally:
                with self._cv:
                    self._sending.pop(path, None)
        elif kind == "tags":
            from mlflow.entities import RunTag

            c.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in args[0].items()])
        elif kind == "backfill":
            missing = missing_metrics(c, self.run_id, args[0])
            if missing:
                log.info("MLflow: backfilling %d metric values from metrics.jsonl", len(missing))
            log_metric_entities(c, self.run_id, missing)
        elif kind == "params":
            log_params(c, self.run_id, args[0])
        elif kind == "resume":
            c.update_run(self.run_id, status="RUNNING")
        elif kind == "terminate":
            c.set_terminated(self.run_id, status=args[0])
        else:
            raise ValueError(f"unknown tracker operation {kind!r}")

    def _worker(self) -> None:
        wait = self.retry_interval
        while True:
            with self._cv:
                while not self._queue and not self._closing and not self._abandon:
                    self._cv.wait()
                if self._abandon or not self._queue:
                    return
                kind, args = self._queue[0]
                self._busy, self._head_read = True, False
            try:
                self._apply(kind, args)
            except Exception as e:
                if not is_permanent(e):
                    if self.outage_since is None:
                        self.outage_since = time.monotonic()
                        log.warning("MLflow at %s unreachable (%s); buffering, training goes on", self.tracking_uri, e)
                    with self._cv:  # back off; once finish() is waiting, retry every 0.5 s until it gives up
                        self._busy = False
                        if self._closing:
                            self._cv.wait_for(lambda: self._abandon, timeout=min(wait, 0.5))
                        else:
                            self._cv.wait_for(lambda: self._closing or self._abandon, timeout=wait)
                    wait = min(wait * 2, self.max_retry_interval)
                    continue
                log.warning("MLflow rejected a %s operation (%s); dropped (metrics.jsonl keeps metrics)", kind, e)
                self.dropped.append((kind, str(e)))
            with self._cv:
                self._queue.popleft()
                self._busy = False
                self._cv.notify_all()
            self.sent_batches += 1
            if self.outage_since is not None:
                log.warning(
                    "MLflow at %s reachable again after %.0f s; flushing %d buffered operations",
                    self.tracking_uri,
                    time.monotonic() - self.outage_since,
                    self.pending(),
                )
                self.outage_since, wait = None, self.retry_interval

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (default ``flush_timeout``) for the queue to drain."""
        if self._thread is None:
            return True
        with self._cv:
            return self._cv.wait_for(
                lambda: not self._queue, timeout=self.flush_timeout if timeout is None else timeout
            )

    def final_provenance(self) -> None:
        """Queue ``<run_dir>/provenance.json`` unless MLflow already has it as it is now: the start uploads the
        RUNNING snapshot, and whoever ends the run rewrites it with the final status (and may upload it, then
        nothing more is sent)."""
        if not self.run_dir:
            return
        path = os.path.abspath(os.path.join(self.run_dir, "provenance.json"))
        if not os.path.exists(path):
            return
        with self._cv:  # an upload not in flight yet reads the file as it is now
            queued = [i for i, (k, a) in enumerate(self._queue) if k == "artifact" and os.path.abspath(a[0]) == path]
            if any(i > 0 or not self._busy or not self._head_read for i in queued):  # one will read it as it is now
                return
            sent = {self._uploaded.get(path), self._sending.get(path)} - {None}
        if file_state(path) not in sent:
            self._submit("artifact", path, None)

    def finish(self, status="FINISHED"):
        if self.run_id is None:
            return
        self.final_provenance()
        self._submit("terminate", status)
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        drained = self.flush()
        if not drained:
            steps = [a[1] for k, a in list(self._queue) if k == "metrics"]
            span = f" (steps {min(steps)}..{max(steps)})" if steps else ""
            log.error(
                "MLflow at %s still unreachable after %.0f s: %d operations%s not sent. Every metric is in "
                "metrics.jsonl; upload the rest with `rlexp replay %s`",
                self.tracking_uri,
                self.flush_timeout,
                self.pending(),
                span,
                self.run_dir or "<run_dir>",
            )
        with self._cv:
            self._abandon = True
            self._cv.notify_all()
        # an in-flight request is bounded by the HTTP timeout and retries; wait for it so nothing is
        # sent behind a later `rlexp replay`
        self._thread.join(timeout=(self.request_timeout + 1) * (self.max_retries + 2))
        self._thread = None
