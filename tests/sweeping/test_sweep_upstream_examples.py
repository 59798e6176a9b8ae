"""The upstream hydra-optuna-sweeper's documented examples (tests/sweeping/upstream_examples/: plain Hydra
apps, no rlexp config, written from its docs) run with ``hydra/sweeper=rlexp_optuna`` and upstream's
config keys only, and reach what the docs say: the sphere's best near 0 when minimising, a non-empty
Pareto front, the grid's exact points, a custom search space within its bounds, a sweep whose jobs fail
half the time completing under ``max_failure_rate=0.5``. Apps run in this process (as
``python <app>.py --multirun ...`` would), each with its own sweep directory."""

import itertools
import runpy
import sys
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState

EXAMPLES = Path(__file__).parent / "upstream_examples"


@pytest.fixture
def example(tmp_path, monkeypatch):
    """``example(script, *overrides, options=[...])`` runs ``python <script> --multirun [options]
    hydra.sweep.dir=<tmp> overrides`` here; returns the sweep directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as `python <script>` puts the app's folder first
    runs = itertools.count()

    def run(script: str, *overrides: str, options: tuple[str, ...] = ()) -> Path:
        sweep_dir = tmp_path / f"sweep{next(runs)}"
        path = str(EXAMPLES / script)
        monkeypatch.setattr(sys, "argv", [path, "--multirun", *options, f"hydra.sweep.dir={sweep_dir}", *overrides])
        runpy.run_path(path, run_name="__main__")
        return sweep_dir

    return run


def results(sweep_dir: Path):
    return OmegaConf.load(sweep_dir / "optimization_results.yaml")


def study(sweep_dir: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir}/{name}.db")


def job_overrides(sweep_dir: Path, number: int) -> list[str]:
    return list(OmegaConf.load(sweep_dir / str(number) / ".hydra" / "overrides.yaml"))


@pytest.mark.long
def test_sphere_example_minimises_to_near_zero(example):
    """Docs, Example 1: `python example/sphere.py --multirun` (TPE, seed 123, 20 trials)."""
    sweep_dir = example("sphere.py")
    res, s = results(sweep_dir), study(sweep_dir, "sphere")
    assert res.name == "optuna" and res.directions == ["minimize"]
    # upstream's own bound for this example: the 95th percentile of TPE's best over 1000 seeds
    assert res.best_value <= 2.27
    assert res.best_value == res.best_params.x**2 + res.best_params.y**2
    trials = s.trials
    assert len(trials) == 20 and all(t.state == TrialState.COMPLETE for t in trials)
    for t in trials:  # x from range(-5.5, 5.5, step=0.5) (5.5 included, as upstream), y from choice(-5, 0, 5)
        x, y = t.params["x"], t.params["y"]
        assert -5.5 <= x <= 5.5 and (x * 2) % 1 == 0 and y in (-5, 0, 5)
        assert t.value == x**2 + y**2
        # the app has no `trial` node: its jobs get their parameters and nothing else
        assert job_overrides(sweep_dir, t.number) == [f"x={x}", f"y={y}"]


def test_sphere_example_with_a_command_line_search_space_and_upstreams_sampler_keys(example):
    """Upstream's own test: `x=choice(0, 1, 2)` searched, `y=0` fixed, `~z` deleted; the TPE keys its
    docs print are accepted (Optuna 5 warns that the consider_* family is deprecated)."""
    tpe_keys = [
        "hydra.sweeper.sampler.consider_prior=true",
        "hydra.sweeper.sampler.prior_weight=1.0",
        "hydra.sweeper.sampler.consider_magic_clip=true",
        "hydra.sweeper.sampler.consider_endpoints=false",
        "hydra.sweeper.sampler.multivariate=false",
        "hydra.sweeper.sampler.warn_independent_sampling=true",
    ]
    sweep_dir = example("sphere.py", "hydra.sweeper.n_trials=8", *tpe_keys, "x=choice(0, 1, 2)", "y=0", "~z")
    res = results(sweep_dir)
    assert dict(res.best_params) == {"x": 0} and res.best_value == 0  # y is fixed, not searched
    trials = study(sweep_dir, "sphere").trials
    assert all(t.state == TrialState.COMPLETE and t.value == t.params["x"] ** 2 for t in trials)
    assert all(t.user_attrs["y"] == "0" for t in trials)  # fixed values recorded as upstream does
    assert "~z=null" in job_overrides(sweep_dir, 0)


@pytest.mark.long
def test_sphere_example_docs_interval_override(example):
    """Docs: `python example/sphere.py --multirun 'x=interval(-5.0, 5.0)' 'y=interval(0, 10)'`."""
    sweep_dir = example("sphere.py", "hydra.sweeper.n_trials=6", "x=interval(-5.0, 5.0)", "y=interval(0, 10)")
    for t in study(sweep_dir, "sphere").trials:
        assert -5 <= t.params["x"] <= 5 and 0 <= t.params["y"] <= 10
        assert t.value == pytest.approx(t.params["x"] ** 2 + t.params["y"] ** 2)


def dominates(a, b) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


@pytest.mark.long
@pytest.mark.parametrize("command_line", [False, True])
def test_multi_objective_example_returns_a_pareto_front(example, command_line):
    """Docs, Example 2: Binh and Korn, two directions (NSGA-II from the config; upstream's test also runs
    the random sampler over `x=range(0, 5)` `y=range(0, 3)`)."""
    extra = ["hydra/sweeper/sampler=random", "x=range(0, 5)", "y=range(0, 3)"] if command_line else []
    sweep_dir = example("multi-objective.py", "hydra.sweeper.n_trials=10", *extra)
    res, s = results(sweep_dir), study(sweep_dir, "multi-objective")
    assert res.directions == ["minimize", "minimize"]
    front = res.solutions
    assert front  # non-empty
    complete = [t for t in s.trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 10
    for sol in front:
        x, y = sol.params.x, sol.params.y
        assert list(sol["values"]) == [4 * x**2 + 4 * y**2, (x - 5) ** 2 + (y - 5) ** 2]
        assert (x % 1 == 0 and y % 1 == 0) if command_line else (x * 2 % 1 == 0 and y * 2 % 1 == 0)
        assert not any(dominates(t.values, list(sol["values"])) for t in complete)
    numbers = {sol.number for sol in front}
    for t in complete:  # every trial off the front is dominated by a front member
        assert t.number in numbers or any(dominates(list(sol["values"]), t.values) for sol in front)


def test_custom_search_space_example_keeps_z_near_x(example):
    """Docs, custom search space: `configure(cfg, trial)` suggests z within max_z_difference_from_x of
    x, and a new key `+w` (upstream's test: random sampler, seed 123, max_z_difference_from_x=0.3)."""
    sweep_dir = example(
        "custom-search-space-objective.py",
        "hydra.sweeper.n_trials=8",
        "hydra/sweeper/sampler=random",
        "max_z_difference_from_x=0.3",
    )
    res = results(sweep_dir)
    assert abs(res.best_params.x - res.best_params.z) <= 0.3 and 0 <= res.best_params["+w"] <= 1
    for t in study(sweep_dir, "custom-search-space").trials:
        p = t.params
        assert t.state == TrialState.COMPLETE and abs(p["x"] - p["z"]) <= 0.3 and 0 <= p["+w"] <= 1
        assert t.value == pytest.approx(p["+w"] ** 2 + p["x"] ** 2 + p["y"] ** 2 + p["z"] ** 2)


def test_grid_example_visits_exactly_upstreams_points(example):
    """Upstream's grid test config: x=choice(-1, 1), y=range(-1.0, 1.0, step=1) (-1.0 and 0.0: the
    range excludes its stop), z=choice(foo, bar): 8 points, n_trials=20 capped to 8, best x²+y² = 1."""
    sweep_dir = example("sphere.py", options=("--config-name=grid",))
    trials = study(sweep_dir, "sphere").trials
    points = sorted((t.params["x"], t.params["y"], t.params["z"]) for t in trials)
    assert points == sorted(itertools.product([-1, 1], [-1.0, 0.0], ["foo", "bar"]))
    res = results(sweep_dir)
    assert res.best_value == 1 and abs(res.best_params.x) == 1 and res.best_params.y == 0


def test_jobs_failing_half_the_time_complete_under_max_failure_rate_half(example):
    """`max_failure_rate=0.5`: the app raises in every second job (odd job numbers), n_jobs=2 as upstream's
    failure-rate test; the sweep completes with three FAIL and three COMPLETE trials."""
    sweep_dir = example(
        "flaky.py",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.n_jobs=2",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.max_failure_rate=0.5",
    )
    states = {t.number: t.state for t in study(sweep_dir, "sphere").trials}
    assert states == {n: TrialState.FAIL if n % 2 else TrialState.COMPLETE for n in range(6)}
    assert results(sweep_dir).trials == {"COMPLETE": 3, "FAIL": 3}


def test_failing_jobs_stop_the_sweep_unless_max_failure_rate_allows_them(example, capsys):
    """Upstream's failure-rate test: `error=true` (every job raises) passes with max_failure_rate=1.0; with
    the example's 0.0 (upstream's default) the sweep stops after the first failure, naming the error."""
    sweep_dir = example("sphere.py", "hydra.sweeper.n_trials=3", "hydra.sweeper.max_failure_rate=1.0", "error=true")
    assert results(sweep_dir).trials == {"FAIL": 3}
    with pytest.raises(SystemExit):
        sweep_dir = example("sphere.py", "hydra.sweeper.n_trials=3", "error=true")
    assert "RuntimeError: cfg.error is True" in capsys.readouterr().err
    assert len(study(sweep_dir.parent / "sweep1", "sphere").trials) == 1


def test_deprecated_search_space_key_is_used_with_upstreams_warning(example):
    with pytest.warns(UserWarning, match="`hydra.sweeper.search_space` is deprecated"):
        sweep_dir = example("sphere.py", "hydra.sweeper.n_trials=4", options=("--config-name=deprecated_search_space",))
    for t in study(sweep_dir, "sphere").trials:
        assert t.state == TrialState.COMPLETE and -5.5 <= t.params["x"] <= 5.5 and (t.params["x"] * 2) % 1 == 0
    assert abs(results(sweep_dir).best_params.x) <= 5.5


def test_motpe_is_refused_naming_its_replacement(example, capsys):
    with pytest.raises(SystemExit):
        example("sphere.py", options=("--config-name=motpe",))
    err = capsys.readouterr().err
    assert "MOTPESampler was removed in Optuna 4.0" in err and "hydra/sweeper/sampler=tpe" in err


def test_an_empty_search_space_runs_n_trials_jobs(example):
    """As upstream: no params and no sweep override, so each trial runs the config as given."""
    sweep_dir = example("sphere.py", "hydra.sweeper.params=null", "hydra.sweeper.n_trials=3")
    trials = study(sweep_dir, "sphere").trials
    assert [(t.state, t.params, t.value) for t in trials] == [(TrialState.COMPLETE, {}, 2.0)] * 3
