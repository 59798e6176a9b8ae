"""The upstream docs' custom-search-space example: a four-dimensional sphere whose z is searched in
Python, within max_z_difference_from_x of the sampled x, and w is a new key (``+w``)."""

import hydra
from omegaconf import DictConfig
from optuna.trial import Trial


@hydra.main(version_base=None, config_path="custom-search-space", config_name="config")
def multi_dimensional_sphere(cfg: DictConfig) -> float:
    return cfg.w**2 + cfg.x**2 + cfg.y**2 + cfg.z**2


def configure(cfg: DictConfig, trial: Trial) -> None:
    """hydra.sweeper.custom_search_space: called after params are sampled."""
    x = trial.params["x"]
    trial.suggest_float("z", x - cfg.max_z_difference_from_x, x + cfg.max_z_difference_from_x)
    trial.suggest_float("+w", 0.0, 1.0)  # "+": w is not in the config


if __name__ == "__main__":
    multi_dimensional_sphere()
