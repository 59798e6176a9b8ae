"""The ready-made sweeps (conf/sweep/*.yaml, `rlexp train -m +sweep=<name>`): each composes with the
rlexp_optuna sweeper, every searched key exists in the train config, its search space parses and it
states its own direction, objective, n_jobs and failure rate; g_vs_prompts keeps the sample budget;
each runs end to end on the tiny model (two trials)."""

import sys
from pathlib import Path

import optuna
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from optuna.trial import TrialState

from rlexp.config.paths import CONF_DIR
from rlexp.sweeping.objectives import as_list, metric_key
from rlexp.sweeping.search_space import build_search_space
from rlexp.sweeping.spaces import fixed_sample_budget

SWEEPS = sorted(p.stem for p in Path(CONF_DIR, "sweep").glob("*.yaml"))
TARGET = "hydra_plugins.rlexp_optuna_sweeper.rlexp_optuna_sweeper.RLExpOptunaSweeper"


def compose_sweep(name: str, *overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=[f"+sweep={name}", *overrides], return_hydra_config=True)


def test_the_five_documented_sweeps_exist():
    assert SWEEPS == ["accuracy_vs_length", "default_task", "g_vs_prompts", "grpo_lambda_share", "grpo_lr_clip"]


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_composes_and_searches_existing_keys(name):
    cfg = compose_sweep(name)
    s = cfg.hydra.sweeper
    assert s._target_ == TARGET and s.study_name == name
    assert cfg.hydra.sweep.dir == f"multirun/sweeps/{name}"  # fixed, so re-running resumes the study
    space, fixed = build_search_space(OmegaConf.to_container(s.params), [])
    assert space and not fixed
    job = OmegaConf.to_container(cfg, resolve=False)
    for key in space:
        assert OmegaConf.select(OmegaConf.create(job), key) is not None, f"{name}: {key} is not a config key"
    objectives = s.objective if isinstance(s.objective, str) else list(s.objective)
    directions = s.direction if isinstance(s.direction, str) else list(s.direction)
    assert (isinstance(objectives, str)) == (isinstance(directions, str))
    if any(o.startswith("eval/") for o in ([objectives] if isinstance(objectives, str) else objectives)):
        assert cfg.eval.size > 0 and cfg.trainer.eval_every > 0


def test_grpo_lr_clip_keeps_the_clip_range_symmetric():
    cfg = compose_sweep("grpo_lr_clip", "algorithm.loss.eps_low=0.13")
    assert cfg.algorithm.loss.eps_high == 0.13


def test_fixed_sample_budget_derives_prompts_per_step():
    cfg = compose_sweep("g_vs_prompts", "trainer.prompts_per_step=8", "trainer.num_generations=8")

    def trial_with(g):
        study = optuna.create_study()
        study.enqueue_trial({"trainer.num_generations": g})
        trial = study.ask()
        trial.suggest_categorical("trainer.num_generations", [2, 3, 4, 8, 16, 32])
        return trial

    for g in (2, 4, 8, 16, 32):
        assert fixed_sample_budget(cfg, trial_with(g)) == {"trainer.prompts_per_step": 64 // g}
    with pytest.raises(ValueError, match="trainer.num_generations=3 does not divide the budget of 64"):
        fixed_sample_budget(cfg, trial_with(3))


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_states_its_own_choices(name):
    """The sweeper's defaults are upstream's (minimize, the job's returned float, n_jobs 2, no failure
    allowed); a ready sweep states what it needs, so it behaves the same whatever those defaults are."""
    raw = OmegaConf.load(Path(CONF_DIR, "sweep", f"{name}.yaml")).hydra.sweeper
    for key in ("direction", "objective", "n_trials", "n_jobs", "max_failure_rate", "study_name", "params"):
        assert key in raw, f"conf/sweep/{name}.yaml: hydra.sweeper.{key} is not stated"
    assert (raw.n_jobs, raw.max_failure_rate) == (1, 0.25)


TINY = [
    "hydra.sweeper.plots=false",
    "hydra.sweeper.n_trials=2",
    "model=tiny",
    "trainer.max_steps=2",
    "trainer.prompts_per_step=1",
    "trainer.micro_batch_size=8",
    "trainer.num_threads=1",
    "tracker=none",
    "trainer.progress=false",
    "dataset.train_size=32",
    "dataset.eval_size=4",
    "eval.size=2",
    "trainer.eval_every=1",
    "trainer.checkpoint_every=0",
]
SHRINK = {  # only the sizes shrink; every sweep keeps its own search space, sampler and pruner
    "accuracy_vs_length": ["trainer.num_generations=2", "trainer.max_new_tokens=choice(4, 6)"],
    "g_vs_prompts": ["trainer.max_new_tokens=4", "trainer.num_generations=choice(2,4)"],  # budget 1 x 8
}


@pytest.mark.long
@pytest.mark.parametrize("name", SWEEPS)
def test_ready_sweep_runs_two_trials_on_the_tiny_model(name, tmp_path, monkeypatch):
    """`rlexp train -m +sweep=<name>` end to end on the tiny model, two trials."""
    from rlexp.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    extra = SHRINK.get(name, ["trainer.num_generations=2", "trainer.max_new_tokens=4"])
    threads = torch.get_num_threads()
    try:
        main(["train", "-m", f"+sweep={name}", f"hydra.sweep.dir={tmp_path}/s", *TINY, *extra])
    finally:
        torch.set_num_threads(threads)
    cfg = compose_sweep(name)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/s/{name}.db")
    trials = study.trials
    assert len(trials) == 2 and all(t.state == TrialState.COMPLETE for t in trials), [t.user_attrs for t in trials]
    directions = cfg.hydra.sweeper.direction
    assert [d.name.lower() for d in study.directions] == ([directions] if isinstance(directions, str) else directions)
    space, _ = build_search_space(OmegaConf.to_container(cfg.hydra.sweeper.params), extra)
    assert all(set(t.params) == set(space) for t in trials)
    assert study.user_attrs["objectives"] == [metric_key(o) for o in as_list(cfg.hydra.sweeper.objective)]
    assert (tmp_path / "s" / "optimization_results.yaml").exists()
    for t in trials:  # each trial's job ran with its own parameters and knew its trial
        job = OmegaConf.load(Path(t.user_attrs["job_dir"]) / "config.yaml")
        assert (job.trial.study, job.trial.number) == (name, t.number)
        for key, value in t.params.items():
            if OmegaConf.is_config(OmegaConf.select(job, key)):  # a config group (default_task's dataset)
                overrides = OmegaConf.load(Path(t.user_attrs["job_dir"]) / ".hydra" / "overrides.yaml")
                assert f"{key}={value}" in overrides
            else:
                assert OmegaConf.select(job, key) == value
    if len(study.directions) == 1:  # eval/accuracy reported to the trial at each evaluation (steps 1 and 2)
        assert all(sorted(t.intermediate_values) == [1, 2] for t in trials)
    if name == "g_vs_prompts":  # budget 1 x 8 (config.yaml's G) = 8 completions per step, split as prompts x G
        for t in trials:
            g = t.params["trainer.num_generations"]
            assert t.user_attrs["derived"] == {"trainer.prompts_per_step": 8 // g}
            job = OmegaConf.load(Path(t.user_attrs["job_dir"]) / "config.yaml")
            assert (job.trainer.prompts_per_step, job.trainer.num_generations) == (8 // g, g)


@pytest.mark.long
def test_a_ready_sweep_rerun_with_other_fixed_settings_is_refused(tmp_path, monkeypatch, capfd):
    """Issue 16: `rlexp train -m +sweep=<name>` keeps one study per name; re-run with another fixed setting, it
    would add trials of another experiment to it. Refused before any trial, in one line naming the differing
    keys and a new study name; the same settings resume it."""
    from rlexp.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    base = ["train", "-m", "+sweep=grpo_lr_clip", f"hydra.sweep.dir={tmp_path}/s", *TINY]
    base += ["trainer.num_generations=2", "trainer.max_new_tokens=4", "hydra.sweeper.n_trials=1"]
    storage = f"sqlite:///{tmp_path}/s/grpo_lr_clip.db"
    threads = torch.get_num_threads()
    try:
        main(base)
        fixed = optuna.load_study(study_name="grpo_lr_clip", storage=storage).user_attrs["fixed_settings"]
        assert fixed["sweep"] == "grpo_lr_clip" and fixed["model"] == "tiny" and fixed["trainer.max_new_tokens"] == "4"
        assert not any(k.startswith("hydra.") for k in fixed)  # n_trials and the other sweeper settings may change
        capfd.readouterr()
        with pytest.raises(SystemExit) as e:
            main([*base, "trainer.max_new_tokens=6", "dataset.train_size=64"])
        assert e.value.code == 2
        err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and err[0].startswith(
            f"error: hydra.sweeper.study_name=grpo_lr_clip: the study in {storage} was run with other fixed settings "
            "(dataset.train_size: 32 -> 64, trainer.max_new_tokens: 4 -> 6); re-run with its settings to resume it, "
            "or start a new study: hydra.sweeper.study_name=grpo_lr_clip-"
        ), err
        assert len(optuna.load_study(study_name="grpo_lr_clip", storage=storage).trials) == 1
        main([*base[:-1], "hydra.sweeper.n_trials=2"])  # the same fixed settings: resumed, one more trial
    finally:
        torch.set_num_threads(threads)
    trials = optuna.load_study(study_name="grpo_lr_clip", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
