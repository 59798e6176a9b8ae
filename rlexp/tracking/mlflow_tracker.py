"""MLflow tracker: a local SQLite store by default (``mlflow ui --backend-store-uri sqlite:///mlruns.db``),
or any tracking server by URI."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from rlexp.tracking.base import Tracker

log = logging.getLogger(__name__)

MAX_PARAM_LEN = 6000


class MLflowTracker(Tracker):
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str = "rlexp", artifact_location: str | None = None):
        self.tracking_uri, self.experiment, self.artifact_location = tracking_uri, experiment, artifact_location
        self.client = None
        self.run_id = None

    def start(self, run_name, config, params, tags, resume_id=None):
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            loc = None
            if self.artifact_location:
                loc = Path(self.artifact_location).absolute().as_uri() if "://" not in self.artifact_location else self.artifact_location
            try:
                exp_id = self.client.create_experiment(self.experiment, artifact_location=loc)
            except Exception:  # created concurrently by a sibling job of a multirun
                exp_id = self.client.get_experiment_by_name(self.experiment).experiment_id
        else:
            exp_id = exp.experiment_id
        if resume_id:
            self.run_id = resume_id
            self.client.update_run(resume_id, status="RUNNING")
            return resume_id
        run = self.client.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in tags.items()})
        self.run_id = run.info.run_id
        items = [Param(k[:250], str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])
        return self.run_id

    def log_metrics(self, metrics, step):
        from mlflow.entities import Metric
        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v == v]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i:i + 500])

    def log_artifact(self, path, artifact_path=None):
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags):
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def finish(self, status="FINISHED"):
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status=status)
