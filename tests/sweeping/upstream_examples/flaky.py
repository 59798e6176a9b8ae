"""The sphere, raising in every second job (odd job numbers): a job that fails half the time."""

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def flaky_sphere(cfg: DictConfig) -> float:
    if HydraConfig.get().job.num % 2:
        raise RuntimeError("odd job number")
    return cfg.x**2 + cfg.y**2


if __name__ == "__main__":
    flaky_sphere()
