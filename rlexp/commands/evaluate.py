"""``rlexp eval`` (also ``python -m rlexp.commands.evaluate``): the Hydra evaluation app over
``conf/eval.yaml``; the run itself is ``rlexp.runs.evaluation.run_eval``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rlexp.commands.errors import job_errors
from rlexp.config.paths import CONF_DIR
from rlexp.runs.evaluation import run_eval


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="eval")
def main(cfg: DictConfig):
    with job_errors():
        return run_eval(cfg).metrics


if __name__ == "__main__":
    main()
