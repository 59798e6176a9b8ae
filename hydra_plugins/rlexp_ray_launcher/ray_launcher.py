"""The Hydra ``Launcher`` behind ``hydra/launcher=rlexp_ray``: every job is a Ray task that runs it the way Hydra's
own launchers do (``hydra.core.utils.run_job`` on the job's sweep config, composed in the worker as
hydra-joblib-launcher does), so a job folder, its ``.hydra`` files and its return value are those of any launcher.

- ``launch`` submits its jobs and waits for all of them; the rlexp_optuna sweeper calls it once per trial from
  ``n_jobs`` threads, so up to ``n_jobs`` trials run at once, each in a Ray worker process on whichever node has
  the task's resources (``hydra.launcher.ray.remote``).
- Ray starts (or joins, ``hydra.launcher.ray.init.address``) once per process, under a lock, in a thread of its
  own that lives while Ray is up: Ray's head processes are started with PR_SET_PDEATHSIG, so they are killed when
  the *thread* that started them ends, and the sweeper calls ``launch`` from pool threads that end with the sweep.
- A job runs from the sweep's launch directory (``hydra.runtime.cwd``) when that directory exists on its node,
  so relative paths in the config mean what they mean on the command line.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)
_INIT_LOCK = threading.Lock()
KEEPER_POLL_S = 1.0


def _options(cfg: Any) -> dict[str, Any]:
    """The config node as keyword arguments, without the keys left null."""
    if cfg is None:
        return {}
    values = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    return {k: v for k, v in values.items() if v is not None}


def start_ray(init: dict[str, Any]) -> None:
    """``ray.init(**init)`` unless Ray is already up in this process (then its cluster is used as it is), from a
    keeper thread that stays alive until Ray is shut down (see the module docstring)."""
    import ray

    with _INIT_LOCK:
        if ray.is_initialized():
            return
        log.info("starting Ray: ray.init(%s)", ", ".join(f"{k}={v!r}" for k, v in init.items()))
        started: queue.Queue = queue.Queue()

        def keeper() -> None:
            try:
                ray.init(**init)
            except BaseException as e:
                started.put(e)
                return
            started.put(None)
            while ray.is_initialized():
                time.sleep(KEEPER_POLL_S)

        threading.Thread(target=keeper, name="rlexp-ray-keeper", daemon=True).start()
        error = started.get()
        if error is not None:
            raise error


def execute_job(
    idx: int,
    overrides: Sequence[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
) -> JobReturn:
    """One job, in a Ray worker process (hydra-joblib-launcher's ``execute_job``, plus the launch directory)."""
    from hydra.core.hydra_config import HydraConfig

    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    old_cwd = os.getcwd()
    launch_dir = str(config.hydra.runtime.cwd)
    if os.path.isdir(launch_dir):
        os.chdir(launch_dir)
    try:
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    finally:
        os.chdir(old_cwd)


class RLExpRayLauncher(Launcher):
    def __init__(self, ray: DictConfig) -> None:
        self.ray_cfg = ray
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self._remote = None  # the job's Ray remote function with the task options, made at the first launch
        self._lock = threading.Lock()

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        try:
            import ray
        except ImportError as e:
            raise ImportError(
                "hydra/launcher=rlexp_ray needs Ray: pip install -e '.[cluster]' (or the ray version pinned there)"
            ) from e
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        with self._lock:  # the first launch; the sweeper's other threads wait for it
            if self._remote is None:
                setup_globals()
                configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
                Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
                start_ray(_options(self.ray_cfg.get("init")))
                self._remote = ray.remote(execute_job).options(**_options(self.ray_cfg.get("remote")))
        remote = self._remote
        singleton_state = Singleton.get_state()
        context, config, task = self.hydra_context, self.config, self.task_function
        refs = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
            refs.append(remote.remote(idx, list(overrides), context, config, task, singleton_state))
        return ray.get(refs)
