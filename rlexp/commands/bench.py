"""``rlexp bench`` (also ``python -m rlexp.commands.bench``): the Hydra bench app over ``conf/bench.yaml``;
the harness is ``rlexp.bench.harness``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rlexp.bench.harness import command_line, run
from rlexp.commands.errors import job_errors
from rlexp.config.paths import CONF_DIR


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="bench")
def main(cfg: DictConfig):
    with job_errors():
        report = run(cfg, command_line())
    return report["ratio"]


if __name__ == "__main__":
    main()
