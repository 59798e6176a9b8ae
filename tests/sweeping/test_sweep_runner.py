"""The sweep loop (rlexp.sweeping.runner) with a stand-in launcher whose jobs are plain Python functions
of their overrides: failure tolerance, asynchronous launches, the study-wide budget shared by workers
and resumes, recovery of interrupted trials, pruning through the trial callback. The real training
jobs are exercised end to end in test_sweep_tiny.py."""

import threading
import time

import optuna
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.trial import TrialState

from rlexp.sweeping import trials as tr
from rlexp.sweeping.callback import TrialReporter
from rlexp.sweeping.objectives import objective_values
from rlexp.sweeping.runner import OptunaSweep, SweepConfigError, trial_node_key
from rlexp.sweeping.storage import default_storage


def settings(**kw):
    base = dict(
        sampler={"_target_": "optuna.samplers.RandomSampler", "seed": 0},
        pruner={"_target_": "optuna.pruners.NopPruner"},
        direction="maximize",
        objective="score",
        report_metric=None,
        storage=None,
        study_name="s",
        n_trials=4,
        n_jobs=1,
        max_failure_rate=0.25,
        params={"x": "interval(0, 1)"},
        custom_search_space=None,
        heartbeat_interval=30.0,
        grace_period=None,
        plots=False,
        trial_key="trial",
        search_space=None,
    )
    base.update(kw)
    return OmegaConf.create(base)


class FakeLauncher:
    """Runs ``job(values)`` for each job, ``values`` being its parsed overrides; records launches."""

    def __init__(self, job, sweep_dir):
        self.job, self.sweep_dir = job, sweep_dir
        self.launched: list[int] = []
        self.times: dict[int, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def launch(self, job_overrides, initial_job_idx):
        out = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            with self.lock:
                self.launched.append(idx)
            values = {o.get_key_element(): o.value() for o in OverridesParser.create().parse_overrides(list(overrides))}
            ret = JobReturn(
                overrides=overrides,
                task_name="train",
                hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": f"{self.sweep_dir}/{idx}"}}}),
            )
            start = time.monotonic()
            try:
                ret.return_value = self.job(values)
                ret.status = JobStatus.COMPLETED
            except Exception as e:
                ret.return_value = e
                ret.status = JobStatus.FAILED
            self.times[idx] = (start, time.monotonic())
            out.append(ret)
        return out


def make_sweep(tmp_path, job, sequential=True, trial_node=True, **kw):
    """A sweep over ``job``; its app config has rlexp's ``trial`` node unless ``trial_node=False``."""
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "job": {"name": "train"}}})
    if trial_node:
        config.trial = {"storage": None, "study": None, "number": None}
    launcher = FakeLauncher(job, tmp_path)
    return OptunaSweep(settings(**kw), config, launcher, sequential=sequential), launcher


def load(tmp_path, name="s"):
    return optuna.load_study(study_name=name, storage=default_storage(tmp_path, name))


def test_a_failing_trial_is_recorded_fail_with_its_error_and_the_sweep_goes_on(tmp_path):
    def job(v):
        if v["x"] == 2:
            raise ValueError("optimizer.lr=-1.0: must be > 0")
        return {"score": float(v["x"])}

    sweep, launcher = make_sweep(
        tmp_path,
        job,
        sampler={"_target_": "optuna.samplers.GridSampler", "seed": 0},
        params={"x": "choice(1, 2, 3, 4)"},
        n_trials=10,
        max_failure_rate=0.25,
    )
    results = sweep.run([])
    study = load(tmp_path)
    states = {t.params["x"]: t.state for t in study.trials}
    assert len(study.trials) == 4  # capped at the grid size
    assert states == {1: TrialState.COMPLETE, 2: TrialState.FAIL, 3: TrialState.COMPLETE, 4: TrialState.COMPLETE}
    failed = next(t for t in study.trials if t.state == TrialState.FAIL)
    assert failed.user_attrs["error"] == "ValueError: optimizer.lr=-1.0: must be > 0"
    assert "Traceback" in failed.user_attrs["traceback"]
    assert results["best_params"] == {"x": 4} and results["best_value"] == 4.0
    assert (tmp_path / "optimization_results.yaml").exists() and "optimizer.lr=-1.0" in (
        tmp_path / "summary.md"
    ).read_text()


def test_more_failures_than_the_rate_allows_stop_the_sweep_with_an_error_naming_the_key(tmp_path):
    sweep, launcher = make_sweep(tmp_path, lambda v: 1 / 0, n_trials=8, max_failure_rate=0.25)
    with pytest.raises(RuntimeError, match=r"max_failure_rate=0.25.*ZeroDivisionError"):
        sweep.run([])
    assert len(launcher.launched) == 3  # 3 failures > 0.25 * 8: no fourth trial launched
    assert (tmp_path / "optimization_results.yaml").exists()


def test_missing_objective_metric_fails_the_trial_naming_the_metric(tmp_path):
    sweep, _ = make_sweep(
        tmp_path,
        lambda v: {"eval/acuracy": 1.0, "reward/mean": 0.5},
        objective="eval/accuracy",
        n_trials=1,
        max_failure_rate=1.0,
    )
    sweep.run([])
    err = load(tmp_path).trials[0].user_attrs["error"]
    assert "hydra.sweeper.objective" in err and "'eval/accuracy'" in err and "eval/acuracy" in err


def test_pass_at_k_objective_is_read_under_its_logged_name(tmp_path):
    sweep, _ = make_sweep(tmp_path, lambda v: {"eval/gsm8k/pass_at_1": 0.25}, objective="eval/gsm8k/pass@1", n_trials=1)
    assert sweep.run([])["best_value"] == 0.25


def test_trials_start_as_soon_as_a_slot_frees_no_batch_barrier(tmp_path):
    started, others_started, lock = set(), threading.Event(), threading.Lock()

    def job(v):
        with lock:
            started.add(v["trial.number"])
            if {1, 2, 3, 4} <= started:
                others_started.set()
        if v["trial.number"] == 0:  # the slow trial: still running while the other slot serves trials 1..4
            return {"score": float(others_started.wait(timeout=120))}
        return {"score": v["x"]}

    sweep, launcher = make_sweep(tmp_path, job, sequential=False, n_jobs=2, n_trials=5)
    sweep.run([])
    # with batches of n_jobs=2, trial 2 would wait for trial 0 to end, and trial 0 would time out
    assert load(tmp_path).trials[0].value == 1.0
    assert sorted(launcher.launched) == [0, 1, 2, 3, 4]


def test_resume_continues_numbering_and_repeats_no_finished_trial(tmp_path):
    grid = {"_target_": "optuna.samplers.GridSampler", "seed": 1}
    sweep, launcher = make_sweep(
        tmp_path, lambda v: {"score": v["x"]}, sampler=grid, params={"x": "choice(1, 2, 3, 4)"}, n_trials=2
    )
    sweep.run([])
    assert launcher.launched == [0, 1]
    sweep, launcher = make_sweep(
        tmp_path, lambda v: {"score": v["x"]}, sampler=grid, params={"x": "choice(1, 2, 3, 4)"}, n_trials=4
    )
    sweep.run([])
    assert launcher.launched == [2, 3]
    # the grid sampler read the finished trials from the storage: the four trials cover the grid once
    assert sorted(t.params["x"] for t in load(tmp_path).trials) == [1, 2, 3, 4]
    sweep, launcher = make_sweep(tmp_path, lambda v: {"score": v["x"]}, params={"x": "choice(1, 2, 3, 4)"}, n_trials=4)
    sweep.run([])
    assert launcher.launched == []


def test_two_workers_on_one_storage_share_the_budget(tmp_path):
    runs = []

    def worker():
        sweep, launcher = make_sweep(tmp_path, lambda v: (time.sleep(0.05), {"score": v["x"]})[1], n_trials=6)
        sweep.run([])
        runs.append(launcher.launched)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    launched = runs[0] + runs[1]
    assert sorted(launched) == [0, 1, 2, 3, 4, 5]
    assert len({t.params["x"] for t in load(tmp_path).trials}) == 6  # per-trial seeds: no repeated draws


def test_a_trial_left_running_by_a_killed_worker_is_retried(tmp_path):
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=1)
    sweep.run([])  # creates the study with one finished trial
    study = load(tmp_path)
    orphan = study.ask()
    orphan.suggest_float("x", 0, 1)
    study._storage.set_trial_system_attr(orphan._trial_id, tr.HEARTBEAT, time.time() - 3600)
    sweep, launcher = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=3, heartbeat_interval=1.0)
    sweep.run([])
    trials = load(tmp_path).trials
    assert trials[1].state == TrialState.FAIL and trials[1].system_attrs[tr.INTERRUPTED]
    assert trials[1].user_attrs["error"].startswith("interrupted: no heartbeat")
    retry = trials[2]
    assert retry.user_attrs["retry_of"] == 1 and retry.params == orphan.params and retry.state == TrialState.COMPLETE
    assert launcher.launched == [2, 3] and tr.counted(trials) == 3


def test_a_running_trial_with_a_fresh_heartbeat_is_left_alone(tmp_path):
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=1)
    sweep.run([])
    study = load(tmp_path)
    other = study.ask()
    study._storage.set_trial_system_attr(other._trial_id, tr.HEARTBEAT, time.time())
    assert tr.recover_stale(study, grace_period=60) == []
    assert study._storage.get_trial(other._trial_id).state == TrialState.RUNNING


class FakeTracker:
    def __init__(self):
        self.tags = {}

    def set_tags(self, tags):
        self.tags.update(tags)


class FakeTrainer:
    def __init__(self, run_dir):
        self.tags, self.tracker, self.run_dir = {}, FakeTracker(), run_dir


def test_pruned_jobs_are_told_pruned_with_their_last_value_and_tagged(tmp_path):
    trainers = {}

    def job(v):  # a job reporting a curve that ends at x, the way the trainer callback is driven
        reporter = TrialReporter(v["trial.storage"], v["trial.study"], v["trial.number"])
        trainer = trainers[v["trial.number"]] = FakeTrainer(tmp_path / str(v["trial.number"]))
        reporter.bind(trainer)
        for step in range(1, 6):
            if reporter.on_step_end(step, {"score": v["x"] * step / 5}, {}):
                break
        return {"score": v["x"] * step / 5}

    sweep, _ = make_sweep(
        tmp_path, job, n_trials=8, pruner={"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 2}
    )
    sweep.run([])
    trials = load(tmp_path).trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned, [(t.params, t.state) for t in trials]
    for t in pruned:
        step = t.user_attrs["pruned_at_step"]
        assert t.value == pytest.approx(t.params["x"] * step / 5) == t.intermediate_values[step]
        assert trainers[t.number].tracker.tags == {"trial_state": "PRUNED", "pruned_at_step": str(step)}
    for t in trials:
        assert trainers[t.number].tags == {"optuna.study": "s", "optuna.trial": str(t.number)}
        assert t.user_attrs["run_dir"].endswith(f"/{t.number}")
    assert all(len(t.intermediate_values) == 5 for t in trials if t.state == TrialState.COMPLETE)


def test_configuration_errors_name_the_sweeper_key(tmp_path):
    with pytest.raises(SweepConfigError, match="hydra.sweeper.pruner"):
        make_sweep(
            tmp_path,
            None,
            direction=["maximize", "minimize"],
            objective=["a", "b"],
            pruner={"_target_": "optuna.pruners.MedianPruner"},
        )
    with pytest.raises(SweepConfigError, match="hydra.sweeper.objective has 1 metric"):
        make_sweep(tmp_path, None, direction=["maximize", "minimize"])
    with pytest.raises(SweepConfigError, match="hydra.sweeper.direction"):
        make_sweep(tmp_path, None, direction="up")
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": 1.0}, n_trials=1)
    sweep.run([])
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": 1.0}, direction="minimize")
    with pytest.raises(SweepConfigError, match=r"hydra.sweeper.direction=\['minimize'\].*created with \['maximize'\]"):
        sweep.run([])


def test_a_journal_file_storage_works_like_sqlite(tmp_path):
    journal = tmp_path / "study.log"

    def job(v):
        reporter = TrialReporter(v["trial.storage"], v["trial.study"], v["trial.number"])
        reporter.on_step_end(1, {"score": v["x"]}, {})
        return {"score": v["x"]}

    sweep, launcher = make_sweep(tmp_path, job, storage=f"journal:{journal}", n_trials=3)
    sweep.run([])
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert all(t.intermediate_values == {1: t.params["x"]} for t in study.trials)
    assert launcher.launched == [0, 1, 2]


def test_importances_only_when_the_objective_varies(tmp_path):
    sweep, _ = make_sweep(tmp_path / "flat", lambda v: {"score": 0.25}, n_trials=3)
    assert sweep.run([])["importances"] == {"score": {}}
    sweep, _ = make_sweep(
        tmp_path / "varies",
        lambda v: {"score": v["x"]},
        params={"x": "interval(0, 1)", "y": "interval(0, 1)"},
        n_trials=10,
    )
    imp = sweep.run([])["importances"]["score"]
    assert set(imp) == {"x", "y"} and imp["x"] > imp["y"]


def test_only_an_app_with_the_trial_node_gets_the_trial_overrides(tmp_path):
    seen = []
    job = lambda v: (seen.append(sorted(v)), {"score": v["x"]})[1]
    make_sweep(tmp_path / "rlexp", job, n_trials=1)[0].run([])
    make_sweep(tmp_path / "plain", job, n_trials=1, trial_node=False)[0].run([])
    assert seen == [["trial.number", "trial.storage", "trial.study", "x"], ["x"]]
    config = OmegaConf.create({"trial": {"number": 1}, "other": {"storage": 1, "study": 1, "number": 1}})
    assert trial_node_key("trial", config) is None  # not the three keys: another app's node of that name
    assert trial_node_key("other", config) == "other" and trial_node_key(None, config) is None


def test_with_a_null_objective_the_job_returns_its_values_as_upstream(tmp_path):
    sweep, _ = make_sweep(tmp_path / "one", lambda v: v["x"], objective=None, direction="minimize", n_trials=2)
    assert sweep.run([])["best_value"] == min(t.params["x"] for t in load(tmp_path / "one").trials)
    two = ["minimize", "maximize"]
    sweep, _ = make_sweep(tmp_path / "two", lambda v: (v["x"], 2 * v["x"]), objective=None, direction=two, n_trials=2)
    sweep.run([])
    assert all(t.values == [t.params["x"], 2 * t.params["x"]] for t in load(tmp_path / "two").trials)
    sweep, _ = make_sweep(tmp_path / "dict", lambda v: {"score": 1.0}, objective=None, n_trials=1, max_failure_rate=1)
    sweep.run([])
    assert "hydra.sweeper.objective is null" in load(tmp_path / "dict").trials[0].user_attrs["error"]


@pytest.mark.parametrize(
    "returned,n,expected",
    [(0.5, 1, [0.5]), ("0.5", 1, [0.5]), (3, 1, [3.0]), ([1, 2], 2, [1.0, 2.0]), ((1.5,), 1, [1.5])],
)
def test_returned_values_are_read_as_upstream(returned, n, expected):
    assert objective_values(returned, [], n) == expected


@pytest.mark.parametrize(
    "returned,n,needle",
    [("abc", 1, "expected a float"), (0.5, 2, "expected a list of 2 floats"), ([1, 2], 1, "1 hydra.sweeper.direction")],
)
def test_unreadable_returned_values_fail_the_trial_with_a_reason(returned, n, needle):
    with pytest.raises(ValueError, match=needle):
        objective_values(returned, [], n)


def test_a_pruner_needs_a_reported_metric(tmp_path):
    with pytest.raises(SweepConfigError, match="hydra.sweeper.pruner needs a metric"):
        make_sweep(tmp_path, None, objective=None, pruner={"_target_": "optuna.pruners.MedianPruner"})


def test_the_deprecated_search_space_key(tmp_path):
    explicit = {"x": {"type": "int", "low": 1, "high": 3}}
    with pytest.warns(UserWarning, match="`hydra.sweeper.search_space` is deprecated"):
        sweep, _ = make_sweep(tmp_path / "old", lambda v: {"score": v["x"]}, params=None, search_space=explicit)
        sweep.run([])
    assert {t.params["x"] for t in load(tmp_path / "old").trials} <= {1, 2, 3}
    with pytest.warns(UserWarning, match="Both hydra.sweeper.params and hydra.sweeper.search_space"):
        sweep, _ = make_sweep(tmp_path / "both", lambda v: {"score": v["x"]}, search_space=explicit, n_trials=2)
        sweep.run([])
    assert all(0 <= t.params["x"] <= 1 for t in load(tmp_path / "both").trials)  # params' interval(0, 1)


# ---- issue 16: stale trials, fixed settings, objectives checked before the first trial ----------------------
def orphan(tmp_path, owner=None, beat=None):
    """A RUNNING trial of study ``s`` as a killed (or another) worker leaves it: its parameter drawn, its
    heartbeat and owner stamped."""
    study = load(tmp_path)
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    study._storage.set_trial_system_attr(trial._trial_id, tr.HEARTBEAT, time.time() if beat is None else beat)
    if owner is not None:
        study._storage.set_trial_system_attr(trial._trial_id, tr.OWNER, owner)
    return trial


def dead_owner() -> dict:
    """The owner record of a sweep process on this machine that has ended."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    record = {**tr.owner_record(), "pid": proc.pid, "start": tr.process_start(proc.pid)}
    proc.wait()
    return record


def test_a_sweep_killed_mid_trial_is_completed_by_an_immediate_rerun(tmp_path):
    """The killed sweep's trial has a fresh heartbeat (well within the grace period) but its owner process on
    this machine is gone: the re-run fails it as interrupted at once and runs its parameters again, so the
    study ends with n_trials COMPLETE trials (before: the re-run exited 0 with the trial RUNNING forever)."""
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=1)
    sweep.run([])
    killed = orphan(tmp_path, owner=dead_owner())
    sweep, launcher = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=2)  # grace period: 120 s
    started = time.monotonic()
    sweep.run([])
    assert time.monotonic() - started < 30
    trials = load(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs["error"].startswith("interrupted: its sweep process (pid ")
    assert trials[2].user_attrs["retry_of"] == 1 and trials[2].params == killed.params
    assert launcher.launched == [2]


def test_a_live_owner_on_this_machine_keeps_its_trial_whatever_its_heartbeat(tmp_path):
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=1)
    sweep.run([])
    mine = orphan(tmp_path, owner=tr.owner_record(), beat=time.time() - 3600)
    assert tr.recover_stale(load(tmp_path), grace_period=60) == []
    assert load(tmp_path)._storage.get_trial(mine._trial_id).state == TrialState.RUNNING
    reused = {**tr.owner_record(), "start": "1"}  # this pid, another start time: the owner died, its pid reused
    orphan(tmp_path, owner=reused)
    assert tr.recover_stale(load(tmp_path), grace_period=60) == [2]


def test_a_silent_trial_of_another_machine_is_waited_for_then_retried(tmp_path):
    """With nothing left to launch, a worker does not stop while a trial of another machine may be dead: that
    one shows no new heartbeat, so once silent for grace_period it is retried here."""
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=1)
    sweep.run([])
    elsewhere = {"machine": "another-host|boot|pid:[1]", "pid": 1, "start": "1", "host": "another-host"}
    orphan(tmp_path, owner=elsewhere)
    sweep, launcher = make_sweep(
        tmp_path, lambda v: {"score": v["x"]}, n_trials=2, heartbeat_interval=0.2, grace_period=1.0
    )
    sweep.run([])
    trials = load(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs["error"].startswith("interrupted: no heartbeat for")
    assert launcher.launched == [2]


@pytest.mark.long
def test_a_beating_trial_of_another_machine_is_left_to_its_worker(tmp_path):
    sweep, _ = make_sweep(tmp_path, lambda v: {"score": v["x"]}, n_trials=1)
    sweep.run([])
    elsewhere = {"machine": "another-host|boot|pid:[1]", "pid": 1, "start": "1", "host": "another-host"}
    other = orphan(tmp_path, owner=elsewhere)
    stop = threading.Event()

    def beat():  # the other machine's worker, alive
        storage = load(tmp_path)._storage
        while not stop.wait(0.1):
            storage.set_trial_system_attr(other._trial_id, tr.HEARTBEAT, time.time())

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        sweep, launcher = make_sweep(
            tmp_path, lambda v: {"score": v["x"]}, n_trials=2, heartbeat_interval=0.2, grace_period=30.0
        )
        started = time.monotonic()
        sweep.run([])
    finally:
        stop.set()
        beating.join()
    assert time.monotonic() - started < 10 and launcher.launched == []
    assert load(tmp_path)._storage.get_trial(other._trial_id).state == TrialState.RUNNING


def test_a_rerun_with_other_fixed_settings_is_refused_naming_the_keys(tmp_path):
    job = lambda v: {"score": v["x"]}  # noqa: E731
    sweep, _ = make_sweep(tmp_path, job, n_trials=1)
    sweep.run(["model=tiny", "+trainer.max_steps=5"])
    assert load(tmp_path).user_attrs["fixed_settings"] == {"model": "tiny", "trainer.max_steps": "5"}
    sweep, launcher = make_sweep(tmp_path, job, n_trials=2)
    with pytest.raises(SweepConfigError) as e:
        sweep.run(["model=smollm2_135m", "optimizer.lr=1e-5"])
    message = str(e.value)
    assert "\n" not in message and message.startswith(
        f"hydra.sweeper.study_name=s: the study in {default_storage(tmp_path, 's')} was run with other fixed "
        "settings (model: tiny -> smollm2_135m, optimizer.lr: (not set) -> 1e-05, trainer.max_steps: 5 -> (not set)); "
        "re-run with its settings to resume it, or start a new study: hydra.sweeper.study_name=s-"
    )
    assert message.endswith(" and a new hydra.sweep.dir")  # this sweep dir is not named after the study
    assert launcher.launched == [] and len(load(tmp_path).trials) == 1
    new_name = message.split("hydra.sweeper.study_name=")[-1].split()[0]
    sweep, launcher = make_sweep(tmp_path / "new", job, n_trials=1, study_name=new_name)
    sweep.run(["model=smollm2_135m", "optimizer.lr=1e-5"])
    assert launcher.launched == [0]
    sweep, launcher = make_sweep(tmp_path, job, n_trials=2)  # the same settings (`+` or not): resumed
    sweep.run(["trainer.max_steps=5", "model=tiny", "trainer.device=cuda:1"])  # a worker's own device: allowed
    assert launcher.launched == [1]


def compose_train(overrides):
    """rlexp train's job config for ``overrides``, as the sweeper's Hydra context composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlexp.config.paths import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def check(tmp_path, arguments, **kw):
    """Run the sweep's pre-trial objective check for a train app with these command-line overrides."""
    from rlexp.sweeping.search_space import build_search_space

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "job": {"name": "train"}}})
    sweep = OptunaSweep(settings(**kw), config, None, sequential=True, compose=compose_train)
    sweep.space, sweep.fixed = build_search_space(None, arguments)
    sweep.check_objectives()


def test_the_objective_is_checked_against_every_searched_reward_and_eval_setting(tmp_path):
    from rlexp.sweeping.metric_names import MetricNameError

    lr = "optimizer.lr=tag(log, interval(1e-6, 1e-4))"
    check(tmp_path, [lr, "eval.size=choice(0, 4)"], objective="eval/accuracy")  # evaluated in some trials
    check(tmp_path, [lr, "reward=choice(accuracy, length_penalty)"], objective="reward/length_penalty/mean")
    check(tmp_path, [lr, "reward=length_penalty"], objective="reward/length_penalty/mean")
    check(tmp_path, [lr], objective="reward/acc/mean", check_objective=False)
    check(tmp_path, [lr, "+benchmark=offline"], objective="eval/rg_chain_sum/pass@1")
    with pytest.raises(MetricNameError) as e:
        check(tmp_path, [lr, "reward=accuracy"], objective="reward/length_penalty/mean")
    assert str(e.value).startswith(
        "hydra.sweeper.objective: 'reward/length_penalty/mean' is not a metric these trials return "
        "(reward terms: ['accuracy']); closest: "
    )
    with pytest.raises(MetricNameError, match=r"^hydra.sweeper.report_metric: 'reward/maen' is not a metric"):
        check(tmp_path, [lr], objective="reward/mean", report_metric="reward/maen")
    with pytest.raises(MetricNameError, match=r"'eval/accuracy' needs evaluation"):
        check(tmp_path, [lr, "eval.size=0"], objective="eval/accuracy")
    with pytest.raises(MetricNameError, match=r"'eval/gsm8k/pass@1' is not a metric these trials return \(benchm"):
        check(tmp_path, [lr, "+benchmark=offline"], objective="eval/gsm8k/pass@1")


def test_an_app_that_is_not_rlexp_train_gets_no_objective_check(tmp_path):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "job": {"name": "app"}}})
    sweep = OptunaSweep(settings(objective="anything"), config, None, sequential=True, compose=lambda o: config)
    sweep.space, sweep.fixed = {}, {}
    sweep.check_objectives()  # nothing to check against: the job's returned dict is read as before
