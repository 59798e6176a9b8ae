"""Structured config of ``hydra/launcher=rlexp_ray``.

Why our own launcher rather than ``hydra-ray-launcher`` 1.2.2: that package pins ``cloudpickle<3`` while
joblib 1.6 (behind ``hydra/launcher=joblib``) needs ``cloudpickle>=3``, and it pulls ``boto3`` and
``ray[default]`` for its AWS mode; its local launcher also calls ``ray.init`` unguarded from every ``launch``, which
races when the rlexp_optuna sweeper launches several trials from its threads at once. The keys follow its local
launcher (``hydra.launcher.ray.init`` → ``ray.init``, ``hydra.launcher.ray.remote`` → the task's
``.options``), typed here; a key left ``null`` is not passed, so Ray's default applies.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

PROVIDER = "rlexp_ray_launcher"


@dataclass
class RayInitConf:
    """``ray.init`` keyword arguments (https://docs.ray.io/en/latest/ray-core/api/doc/ray.init.html)."""

    # "local": start a Ray cluster on this machine for the sweep (stopped when the sweep process exits), even if
    # `ray start` runs one; "auto": join the cluster `ray start` runs on this machine (its nodes run the trials);
    # "<head>:6379" or "ray://<head>:10001" (Ray Client): that cluster; null: Ray's own choice (RAY_ADDRESS, else
    # the latest cluster started here, else a new local one)
    address: Optional[str] = "local"
    # a local cluster's resources (must stay null when joining an existing cluster)
    num_cpus: Optional[int] = None
    num_gpus: Optional[int] = None
    object_store_memory: Optional[int] = None  # bytes; trials pass only configs and results through it
    include_dashboard: Optional[bool] = False  # the dashboard needs ray[default]; off by default
    log_to_driver: bool = True  # trials' stdout/stderr shown in the sweep's terminal
    runtime_env: Optional[dict[str, Any]] = None  # e.g. {env_vars: {HF_HOME: /shared/hf}}
    namespace: Optional[str] = None


@dataclass
class RayRemoteConf:
    """Resources and retries of each trial's task (``ray.remote(...).options``)."""

    num_cpus: float = 1  # CPUs Ray reserves per trial (it sets OMP_NUM_THREADS to match)
    num_gpus: float = 0  # GPUs per trial: 1 gives each trial its own GPU (CUDA_VISIBLE_DEVICES), 0.5 two per GPU
    memory: Optional[int] = None  # bytes of RAM reserved per trial (scheduling only)
    resources: Optional[dict[str, float]] = None  # custom resources, e.g. {node_a100: 1}
    # 0: a trial whose worker process dies (OOM kill, lost node) fails, and the sweeper records it FAIL; Ray's
    # default (3) would re-run it silently
    max_retries: int = 0


@dataclass
class RayConf:
    init: RayInitConf = field(default_factory=RayInitConf)
    remote: RayRemoteConf = field(default_factory=RayRemoteConf)


@dataclass
class RLExpRayLauncherConf:
    _target_: str = "hydra_plugins.rlexp_ray_launcher.ray_launcher.RLExpRayLauncher"
    ray: RayConf = field(default_factory=RayConf)


ConfigStore.instance().store(group="hydra/launcher", name="rlexp_ray", node=RLExpRayLauncherConf, provider=PROVIDER)
