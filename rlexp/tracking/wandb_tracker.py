"""Weights & Biases tracker: offline unless an API key is configured (``WANDB_API_KEY`` or
``tracker.mode=online``). The offline run directory (``<run_dir>/wandb``) can be synced later with
``wandb sync``."""
from __future__ import annotations

import os

from rlexp.tracking.base import Tracker


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, project: str = "rlexp", entity: str | None = None, mode: str | None = None, dir: str = "."):
        self.project, self.entity, self.dir = project, entity, dir
        self.mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = None

    def start(self, run_name, config, params, tags, resume_id=None):
        import wandb
        os.makedirs(self.dir, exist_ok=True)
        self.run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=self.dir, name=run_name,
                              config=config, tags=[f"{k}={v}" for k, v in tags.items()][:64], id=resume_id,
                              resume="allow" if resume_id else None, settings=wandb.Settings(silent=True))
        return self.run.id

    def log_metrics(self, metrics, step):
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path, artifact_path=None):
        self.run.save(str(path), base_path=os.path.dirname(str(path)), policy="now")

    def set_tags(self, tags):
        self.run.tags = tuple(self.run.tags or ()) + tuple(f"{k}={v}" for k, v in tags.items())

    def finish(self, status="FINISHED"):
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "FINISHED" else 1)
            self.run = None
