"""Structured configs of the ``rlexp_optuna`` sweeper (``hydra/sweeper=rlexp_optuna``) and of its
``hydra/sweeper/sampler`` and ``hydra/sweeper/pruner`` groups.

Imported by Hydra's plugin discovery on every run, so this module imports nothing heavy (no optuna).
Keys and defaults follow the upstream ``hydra-optuna-sweeper`` 1.3 where it has them (``sampler``
and its keys, ``direction``, ``storage``, ``study_name``, ``n_trials``, ``n_jobs``,
``max_failure_rate``, ``params``, ``search_space``, ``custom_search_space``), so its configs and
command lines carry over; the differences are listed in the README ("Differences from
hydra-optuna-sweeper"). A sampler key left ``null`` is not passed: Optuna's default applies.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

PROVIDER = "rlexp_optuna_sweeper"


# ---- samplers (hydra/sweeper/sampler=<name>) ---------------------------------------------------
@dataclass
class SamplerConfig:
    _target_: str = MISSING
    seed: Optional[int] = None


@dataclass
class TPESamplerConfig(SamplerConfig):
    """https://optuna.readthedocs.io/en/stable/reference/samplers/generated/optuna.samplers.TPESampler.html
    ``consider_*``, ``prior_weight`` and ``warn_independent_sampling`` (upstream's keys) are deprecated
    in Optuna 5, which warns when they are set; ``multivariate: null`` is Optuna 5's default (on for a
    single objective; upstream's ``false`` was Optuna 2's)."""

    _target_: str = "optuna.samplers.TPESampler"
    consider_prior: Optional[bool] = None
    prior_weight: Optional[float] = None
    consider_magic_clip: Optional[bool] = None
    consider_endpoints: Optional[bool] = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    multivariate: Optional[bool] = None
    warn_independent_sampling: Optional[bool] = None
    group: bool = False
    constant_liar: bool = True  # trials in flight count as "pending" so parallel workers spread out


@dataclass
class RandomSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.RandomSampler"


@dataclass
class CmaEsSamplerConfig(SamplerConfig):
    """Needs the ``cmaes`` package. Continuous/int parameters only (categoricals fall back to random)."""

    _target_: str = "optuna.samplers.CmaEsSampler"
    x0: Optional[Any] = None  # {param: value}; Any, not dict: a command-line dict then replaces null
    sigma0: Optional[float] = None
    n_startup_trials: int = 1
    independent_sampler: Optional[Any] = None  # a sampler config (``_target_: optuna.samplers...``)
    restart_strategy: Optional[str] = None  # restart_strategy/inc_popsize: deprecated (unused) in Optuna 5
    inc_popsize: Optional[int] = None
    popsize: Optional[int] = None
    use_separable_cma: bool = False
    with_margin: bool = False
    consider_pruned_trials: bool = False
    warn_independent_sampling: bool = True
    source_trials: Optional[Any] = None


@dataclass
class GPSamplerConfig(SamplerConfig):
    """Gaussian-process Bayesian optimisation (needs torch and scipy)."""

    _target_: str = "optuna.samplers.GPSampler"
    n_startup_trials: int = 10
    deterministic_objective: bool = False


@dataclass
class NSGAIISamplerConfig(SamplerConfig):
    """Multi-objective genetic algorithm (also works single-objective)."""

    _target_: str = "optuna.samplers.NSGAIISampler"
    population_size: int = 50
    mutation_prob: Optional[float] = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5
    constraints_func: Optional[Any] = None  # a callable (``_target_`` + ``_partial_: true``)


@dataclass
class GridSamplerConfig(SamplerConfig):
    """Every combination of the (discrete) search space; ``n_trials`` is capped at the grid size.
    The grid itself is built from ``hydra.sweeper.params``."""

    _target_: str = "optuna.samplers.GridSampler"


@dataclass
class MOTPESamplerConfig(SamplerConfig):
    """Upstream's ``motpe``: Optuna 4 removed MOTPESampler. Its keys compose so that an upstream config
    reaches the sweeper, which refuses it and names the replacement (``tpe``, multi-objective)."""

    _target_: str = "optuna.samplers.MOTPESampler"
    consider_prior: Optional[bool] = None
    prior_weight: Optional[float] = None
    consider_magic_clip: Optional[bool] = None
    consider_endpoints: Optional[bool] = None
    n_startup_trials: Optional[int] = None
    n_ehvi_candidates: Optional[int] = None


@dataclass
class QMCSamplerConfig(SamplerConfig):
    _target_: str = "optuna.samplers.QMCSampler"
    qmc_type: str = "sobol"
    scramble: bool = False


# ---- pruners (hydra/sweeper/pruner=<name>) -----------------------------------------------------
@dataclass
class NopPrunerConfig:
    """No pruning; intermediate values are still reported (they show in optuna-dashboard)."""

    _target_: str = "optuna.pruners.NopPruner"


@dataclass
class MedianPrunerConfig:
    _target_: str = "optuna.pruners.MedianPruner"
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class PercentilePrunerConfig:
    _target_: str = "optuna.pruners.PercentilePruner"
    percentile: float = 25.0
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class SuccessiveHalvingPrunerConfig:
    _target_: str = "optuna.pruners.SuccessiveHalvingPruner"
    min_resource: Any = "auto"  # int or "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0


@dataclass
class HyperbandPrunerConfig:
    _target_: str = "optuna.pruners.HyperbandPruner"
    min_resource: int = 1
    max_resource: Any = "auto"  # int (usually trainer.max_steps) or "auto"
    reduction_factor: int = 3
    bootstrap_count: int = 0


@dataclass
class ThresholdPrunerConfig:
    _target_: str = "optuna.pruners.ThresholdPruner"
    lower: Optional[float] = None
    upper: Optional[float] = None
    n_warmup_steps: int = 0
    interval_steps: int = 1


# ---- the sweeper (hydra/sweeper=rlexp_optuna) --------------------------------------------------
@dataclass
class RLExpOptunaSweeperConf:
    _target_: str = "hydra_plugins.rlexp_optuna_sweeper.rlexp_optuna_sweeper.RLExpOptunaSweeper"
    _recursive_: bool = False  # sampler/pruner arrive as configs: built per trial / per job
    defaults: list[Any] = field(default_factory=lambda: [{"sampler": "tpe"}, {"pruner": "none"}])

    sampler: Any = MISSING
    pruner: Any = MISSING
    # "minimize" | "maximize", or a list of them (one per objective: multi-objective)
    direction: Any = "minimize"
    # null: the job returns its value(s), as upstream: a float, or a list of floats (one per direction).
    # A metric name (list: one per direction) reads the job's returned metrics dict, e.g. eval/accuracy,
    # length/mean, eval/<bench>/pass@1 (= eval/<bench>/pass_at_1); rlexp train returns such a dict.
    objective: Any = None
    # metric reported at every training step where it is present, for pruning (default: the objective)
    report_metric: Optional[str] = None
    # Optuna storage: null = SQLite file <sweep dir>/<study_name>.db; any SQLAlchemy URL
    # (sqlite:///..., postgresql://...); or journal:<path> for an Optuna journal file
    storage: Optional[str] = None
    study_name: Optional[str] = None  # null: the Hydra job name
    n_trials: int = 20  # trials of the whole study (a resumed/second worker adds up to it)
    n_jobs: int = 2  # trials in flight at once (through the launcher; the basic launcher runs one)
    # stop launching once more than this share of n_trials has failed in this sweep process
    max_failure_rate: float = 0.0
    params: Optional[dict[str, Any]] = None
    # deprecated upstream (1.2): explicit distributions {name: {type, low, high, step, log, choices}},
    # used with a deprecation warning when params is null, ignored (with a warning) when params is set
    search_space: Optional[dict[str, Any]] = None
    # dotted path of fn(cfg, trial) -> None | dict of extra overrides (derived values), upstream's hook
    custom_search_space: Optional[str] = None
    heartbeat_interval: float = 30.0  # s; a RUNNING trial whose heartbeat is older than grace_period
    grace_period: Optional[float] = None  # (default 4 x heartbeat_interval) is taken as interrupted and retried
    plots: bool = True  # optimisation-history / Pareto / importance PNGs in the sweep dir
    # trials' checkpoints kept on disk once they finish: best (the best trial's, or the Pareto front's), all, none
    keep_weights: str = "best"
    # config node that receives the trial identity (<trial_key>.storage/study/number) when the app's
    # config has it with those three keys (rlexp train: `trial`); apps without it get no such override
    # (then jobs cannot report intermediate values, so nothing is pruned)
    trial_key: Optional[str] = "trial"
    # refuse, before the first trial, an objective / report_metric that the jobs surely do not return
    # (rlexp train: checked against the metric names its composed config produces; other apps: no check)
    check_objective: bool = True


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="rlexp_optuna", node=RLExpOptunaSweeperConf, provider=PROVIDER)
    samplers = {
        "tpe": TPESamplerConfig,
        "random": RandomSamplerConfig,
        "cmaes": CmaEsSamplerConfig,
        "gp": GPSamplerConfig,
        "nsgaii": NSGAIISamplerConfig,
        "grid": GridSamplerConfig,
        "qmc": QMCSamplerConfig,
        "motpe": MOTPESamplerConfig,  # refused by the sweeper with the replacement named
    }
    for name, node in samplers.items():
        cs.store(group="hydra/sweeper/sampler", name=name, node=node, provider=PROVIDER)
    pruners = {
        "none": NopPrunerConfig,
        "median": MedianPrunerConfig,
        "percentile": PercentilePrunerConfig,
        "successive_halving": SuccessiveHalvingPrunerConfig,
        "hyperband": HyperbandPrunerConfig,
        "threshold": ThresholdPrunerConfig,
    }
    for name, node in pruners.items():
        cs.store(group="hydra/sweeper/pruner", name=name, node=node, provider=PROVIDER)


register_configs()
