"""The training side of a sweep: which runs get a trial reporter, and the checks it makes first."""

import os

import optuna
import pytest
from omegaconf import open_dict

from rlexp.config.schema import ConfigError
from rlexp.sweeping.callback import TrialReporter, sweep_callbacks


@pytest.fixture
def running_trial(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for key, value in {
        "objectives": ["eval/accuracy"],
        "report_metric": "eval/accuracy",
        "pruner": {"_target_": "optuna.pruners.MedianPruner"},
    }.items():
        study.set_user_attr(key, value)
    return storage, study, study.ask()


def with_trial(cfg, storage, number, **overrides):
    with open_dict(cfg):
        cfg.trial.storage, cfg.trial.study, cfg.trial.number = storage, "s", number
        for key, value in overrides.items():
            section, name = key.split("__")
            cfg[section][name] = value
    return cfg


def test_runs_outside_a_sweep_get_no_callback(tiny_cfg, monkeypatch):
    monkeypatch.delenv("RLEXP_SWEEP", raising=False)
    assert sweep_callbacks(tiny_cfg()) == []
    assert "RLEXP_SWEEP" not in os.environ


def test_a_trial_job_gets_a_reporter_and_names_its_study_and_trial(tiny_cfg, running_trial, monkeypatch):
    storage, _, trial = running_trial
    monkeypatch.setenv("RLEXP_SWEEP", "x")  # restored after the test
    monkeypatch.setenv("RLEXP_TRIAL", "x")
    (reporter,) = sweep_callbacks(with_trial(tiny_cfg(), storage, trial.number, eval__size=4))
    assert isinstance(reporter, TrialReporter) and reporter.metric == "eval/accuracy"
    assert (os.environ["RLEXP_SWEEP"], os.environ["RLEXP_TRIAL"]) == ("s", str(trial.number))
    # training metrics without the reported one: nothing reported; with it: reported at that step
    assert reporter.on_step_end(1, {"reward/mean": 0.5}, {}) is False
    assert reporter.on_step_end(2, {"reward/mean": 0.5}, {"eval/accuracy": 0.25}) is False  # 1st trial: never pruned
    assert optuna.load_study(study_name="s", storage=storage).trials[0].intermediate_values == {2: 0.25}


def test_an_eval_objective_without_evaluation_is_a_config_error(tiny_cfg, running_trial, monkeypatch):
    storage, _, trial = running_trial
    monkeypatch.setenv("RLEXP_SWEEP", "x")
    monkeypatch.setenv("RLEXP_TRIAL", "x")
    with pytest.raises(ConfigError, match=r"needs evaluation: set eval.size > 0 \(now 0\)"):
        sweep_callbacks(with_trial(tiny_cfg(), storage, trial.number, eval__size=0))


def test_a_finished_trial_cannot_be_reported_to_again(tiny_cfg, running_trial, monkeypatch):
    storage, study, trial = running_trial
    study.tell(trial, 0.5)
    monkeypatch.setenv("RLEXP_SWEEP", "x")
    monkeypatch.setenv("RLEXP_TRIAL", "x")
    with pytest.raises(RuntimeError, match=r"trial.number=0: trial 0 of study 's' is already COMPLETE"):
        sweep_callbacks(with_trial(tiny_cfg(), storage, trial.number, eval__size=4))


def test_a_study_without_objective_metrics_fails_the_job_before_training(tiny_cfg, running_trial, monkeypatch):
    """rlexp train returns a metrics dict: with hydra.sweeper.objective null (upstream's returned float) the
    job says so at once instead of training and then failing."""
    storage, study, trial = running_trial
    study.set_user_attr("objectives", [])
    study.set_user_attr("report_metric", None)
    monkeypatch.setenv("RLEXP_SWEEP", "x")
    monkeypatch.setenv("RLEXP_TRIAL", "x")
    with pytest.raises(ConfigError, match="hydra.sweeper.objective is null.*hydra.sweeper.objective=eval/accuracy"):
        sweep_callbacks(with_trial(tiny_cfg(), storage, trial.number, eval__size=4))
