"""Example 1 of the upstream docs: the sphere function, minimum 0 at x = y = 0."""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def sphere(cfg: DictConfig) -> float:
    if cfg.get("error", False):
        raise RuntimeError("cfg.error is True")
    return cfg.x**2 + cfg.y**2


if __name__ == "__main__":
    sphere()
