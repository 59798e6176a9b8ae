"""The Hydra ``Sweeper`` plugin class. Hydra imports every module of ``hydra_plugins`` at start-up,
so this one stays light: Optuna and the sweep loop (``rlexp.sweeping.runner``) load in ``sweep``."""

from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from . import config as _config  # noqa: F401  (registers hydra/sweeper=rlexp_optuna and its sampler/pruner groups)


class RLExpOptunaSweeper(Sweeper):
    def __init__(
        self,
        sampler: Any,
        direction: Any,
        objective: Any,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        max_failure_rate: float,
        params: DictConfig | None,
        pruner: Any = None,
        report_metric: str | None = None,
        custom_search_space: str | None = None,
        heartbeat_interval: float = 30.0,
        grace_period: float | None = None,
        plots: bool = True,
        trial_key: str | None = "trial",
        search_space: DictConfig | None = None,
        keep_weights: str = "best",
        check_objective: bool = True,
    ) -> None:
        self.settings = OmegaConf.create(
            {
                "sampler": sampler,
                "pruner": pruner,
                "direction": direction,
                "objective": objective,
                "report_metric": report_metric,
                "storage": storage,
                "study_name": study_name,
                "n_trials": n_trials,
                "n_jobs": n_jobs,
                "max_failure_rate": max_failure_rate,
                "params": params,
                "custom_search_space": custom_search_space,
                "heartbeat_interval": heartbeat_interval,
                "grace_period": grace_period,
                "plots": plots,
                "trial_key": trial_key,
                "search_space": search_space,
                "keep_weights": keep_weights,
                "check_objective": check_objective,
            }
        )
        self.config: DictConfig | None = None
        self.launcher = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> Any:
        from hydra._internal.core_plugins.basic_launcher import BasicLauncher

        from rlexp.sweeping.runner import OptunaSweep

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        sequential = isinstance(self.launcher, BasicLauncher)
        loader, config = self.hydra_context.config_loader, self.config

        def compose(overrides: list[str]) -> DictConfig:  # a job's config, as the launcher composes it
            return loader.load_sweep_config(config, list(overrides))

        return OptunaSweep(self.settings, self.config, self.launcher, sequential=sequential, compose=compose).run(
            arguments
        )
