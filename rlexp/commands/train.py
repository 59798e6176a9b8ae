"""``rlexp train`` (also ``python -m rlexp.commands.train``): the Hydra train app over ``conf/config.yaml``;
the run itself is ``rlexp.runs.training.run``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rlexp.commands.errors import job_errors
from rlexp.config.paths import CONF_DIR
from rlexp.runs.training import run


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig):
    with job_errors():
        result = run(cfg)
    return {**result.metrics, **result.eval_metrics}


if __name__ == "__main__":
    main()
