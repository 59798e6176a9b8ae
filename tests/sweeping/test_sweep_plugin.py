"""The Hydra plugin: discovery, its config groups, and every sampler/pruner option instantiating on
Optuna 5 and driving a short sweep."""

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.trial import TrialState

from hydra_plugins.rlexp_optuna_sweeper import config as plugin_config
from rlexp.config.paths import CONF_DIR

from .test_sweep_runner import load, make_sweep

SAMPLERS = ["tpe", "random", "cmaes", "gp", "nsgaii", "grid", "qmc"]
PRUNERS = ["none", "median", "percentile", "successive_halving", "hyperband", "threshold"]


def compose_hydra(*overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True).hydra.sweeper


def test_hydra_discovers_the_sweeper():
    assert "RLExpOptunaSweeper" in [p.__name__ for p in Plugins.instance().discover(Sweeper)]


def test_sweeper_config_group_defaults_are_upstreams():
    s = compose_hydra("hydra/sweeper=rlexp_optuna")
    assert s._target_.endswith("RLExpOptunaSweeper") and s._recursive_ is False
    assert s.sampler._target_ == "optuna.samplers.TPESampler" and s.pruner._target_ == "optuna.pruners.NopPruner"
    # upstream hydra-optuna-sweeper 1.3's OptunaSweeperConf defaults
    assert (s.direction, s.n_trials, s.n_jobs, s.max_failure_rate, s.storage, s.study_name) == (
        "minimize",
        20,
        2,
        0.0,
        None,
        None,
    )
    assert s.params is None and s.search_space is None and s.custom_search_space is None
    assert s.objective is None  # the job's returned float(s), as upstream


@pytest.mark.parametrize("name", PRUNERS)
def test_every_pruner_option_instantiates(name):
    extra = ["hydra.sweeper.pruner.lower=0.1"] if name == "threshold" else []  # it needs a bound
    s = compose_hydra("hydra/sweeper=rlexp_optuna", f"hydra/sweeper/pruner={name}", *extra)
    pruner = instantiate(s.pruner)
    assert type(pruner).__name__ == s.pruner._target_.rsplit(".", 1)[-1]


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_option_instantiates_seeded(name):
    s = compose_hydra("hydra/sweeper=rlexp_optuna", f"hydra/sweeper/sampler={name}", "hydra.sweeper.sampler.seed=7")
    kwargs = {"search_space": {"x": [0, 1]}} if name == "grid" else {}
    sampler = instantiate(s.sampler, **kwargs)
    assert type(sampler).__name__ == s.sampler._target_.rsplit(".", 1)[-1]


def seeded_sweep_params(name, tmp_path):
    s = compose_hydra("hydra/sweeper=rlexp_optuna", f"hydra/sweeper/sampler={name}", "hydra.sweeper.sampler.seed=7")
    sampler = OmegaConf.to_container(s.sampler)
    params = (
        {"x": "choice(0.0, 0.5, 1.0)", "y": "range(1, 3)"}
        if name == "grid"
        else {"x": "interval(0, 1)", "y": "int(interval(1, 3))"}
    )

    def run(subdir):
        sweep, _ = make_sweep(
            tmp_path / subdir, lambda v: {"score": v["x"] + v["y"]}, sampler=sampler, params=params, n_trials=4
        )
        sweep.run([])
        trials = load(tmp_path / subdir).trials
        assert all(t.state == TrialState.COMPLETE for t in trials)
        return [t.params for t in trials]

    return run("a"), run("b")


def test_the_default_sampler_runs_a_reproducible_seeded_sweep(tmp_path):
    first, again = seeded_sweep_params("tpe", tmp_path)
    assert len(first) == 4 and first == again


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_runs_a_reproducible_seeded_sweep(name, tmp_path):
    first, again = seeded_sweep_params(name, tmp_path)
    assert len(first) == 4 and first == again


def test_groups_are_registered_under_the_upstream_names():
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo["hydra"]
    assert "rlexp_optuna.yaml" in repo["sweeper"]
    assert {f"{n}.yaml" for n in SAMPLERS} <= set(repo["sweeper"]["sampler"])
    assert {f"{n}.yaml" for n in PRUNERS} <= set(repo["sweeper"]["pruner"])
    assert plugin_config.PROVIDER == "rlexp_optuna_sweeper"


UPSTREAM_SAMPLER_KEYS = {  # hydra-optuna-sweeper 1.3's sampler configs: every key it accepts
    "tpe": [
        "consider_prior=true",
        "prior_weight=1.0",
        "consider_magic_clip=true",
        "consider_endpoints=false",
        "n_startup_trials=10",
        "n_ei_candidates=24",
        "multivariate=false",
        "warn_independent_sampling=true",
    ],
    "random": [],
    "cmaes": [
        "x0={x: 0.5}",
        "sigma0=0.1",
        "independent_sampler={_target_: optuna.samplers.RandomSampler}",
        "warn_independent_sampling=true",
        "consider_pruned_trials=false",
        "restart_strategy=null",
        "inc_popsize=2",
        "use_separable_cma=false",
        "source_trials=null",
    ],
    "nsgaii": [
        "population_size=50",
        "mutation_prob=null",
        "crossover_prob=0.9",
        "swapping_prob=0.5",
        "constraints_func=null",
    ],
    "grid": [],
}


@pytest.mark.parametrize("name", sorted(UPSTREAM_SAMPLER_KEYS))
def test_upstreams_sampler_keys_are_accepted_and_passed_to_optuna(name):
    import warnings

    from rlexp.sweeping.runner import build_sampler

    overrides = [f"hydra.sweeper.sampler.{k}" for k in UPSTREAM_SAMPLER_KEYS[name]]
    s = compose_hydra(
        "hydra/sweeper=rlexp_optuna", f"hydra/sweeper/sampler={name}", "hydra.sweeper.sampler.seed=123", *overrides
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna 5 deprecates some of them (consider_*, restart_strategy)
        sampler = build_sampler(s.sampler, 123, grid={"x": [0, 1]})
    assert type(sampler).__name__ == s.sampler._target_.rsplit(".", 1)[-1]
    if name == "tpe":
        assert sampler._parzen_estimator_parameters.consider_endpoints is False and sampler._multivariate is False
    if name == "cmaes":
        assert sampler._x0 == {"x": 0.5} and sampler._sigma0 == 0.1
        assert type(sampler._independent_sampler).__name__ == "RandomSampler"


def test_motpe_composes_and_is_refused_naming_tpe():
    from rlexp.sweeping.runner import SweepConfigError, build_sampler

    s = compose_hydra(
        "hydra/sweeper=rlexp_optuna", "hydra/sweeper/sampler=motpe", "hydra.sweeper.sampler.n_ehvi_candidates=24"
    )
    with pytest.raises(
        SweepConfigError, match=r"MOTPESampler was removed in Optuna 4.0; use hydra/sweeper/sampler=tpe"
    ):
        build_sampler(s.sampler, None)
