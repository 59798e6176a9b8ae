"""End to end: `rlexp train -m hydra/sweeper=rlexp_optuna ...` on the tiny model, each trial a real
training job (a couple of seconds) launched by Hydra's basic launcher in the sweep process. Sweeps run
in the test process (through the CLI entry point, to skip re-importing torch), except the two-worker
test, which starts two real `rlexp train -m` processes.

The pruning, multi-objective and parallel-worker sweeps optimise ``length/mean`` and ``entropy/mean``:
real per-step metrics that differ between trials on an untrained model (the completion length follows
``trainer.max_new_tokens``, the token entropy follows ``trainer.temperature``)."""

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from omegaconf import OmegaConf
from optuna.trial import TrialState

from rlexp.cli import main as rlexp_main

TRIAL = [
    "model=tiny",
    "trainer.max_steps=3",
    "trainer.prompts_per_step=1",
    "trainer.num_generations=2",
    "trainer.micro_batch_size=2",
    "trainer.num_threads=1",
    "tracker=none",
    "trainer.progress=false",
    "dataset.train_size=32",
    "dataset.eval_size=4",
    "eval.size=0",
    "trainer.checkpoint_every=0",
]
SWEEPER = ["hydra/sweeper=rlexp_optuna", "hydra.sweeper.plots=false", "hydra.sweeper.study_name=s"]


def sweep_args(sweep_dir: Path, *args: str) -> list[str]:
    return ["train", "-m", *SWEEPER, f"hydra.sweep.dir={sweep_dir}", *TRIAL, *args]


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """Run one sweep in this process, from ``tmp_path`` (where tracker=mlflow puts mlruns.db)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    threads = torch.get_num_threads()

    def run(sweep_dir: Path, *args: str) -> None:
        rlexp_main(sweep_args(sweep_dir, *args))

    yield run
    torch.set_num_threads(threads)


def study(sweep_dir: Path, name: str = "s") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{sweep_dir}/{name}.db")


def steps_run(trial) -> int:
    """Training steps the trial's job ran, from its metrics log."""
    rows = (Path(trial.user_attrs["job_dir"]) / "metrics.jsonl").read_text().splitlines()
    return len(rows)


@pytest.mark.long
def test_median_pruner_prunes_trials_and_saves_steps(tmp_path, sweep):
    space = [
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=3",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.max_new_tokens=choice(2,4,6,8)",
    ]
    pruned_dir, plain_dir = tmp_path / "pruned", tmp_path / "plain"
    sweep(
        pruned_dir,
        *space,
        "hydra/sweeper/pruner=median",
        "hydra.sweeper.pruner.n_startup_trials=2",
        "hydra.sweeper.plots=true",
        "tracker=mlflow",
    )
    sweep(plain_dir, *space)
    with_pruner, without = study(pruned_dir).trials, study(plain_dir).trials
    assert len(with_pruner) == len(without) == 6
    assert [t.params for t in with_pruner] == [t.params for t in without]  # same draws, so steps compare fairly
    pruned = [t for t in with_pruner if t.state == TrialState.PRUNED]
    assert pruned, [(t.params, t.state.name) for t in with_pruner]
    assert all(t.state == TrialState.COMPLETE for t in without)
    steps_with, steps_without = sum(map(steps_run, with_pruner)), sum(map(steps_run, without))
    assert steps_without == 6 * 3 and steps_with < steps_without
    for t in pruned:
        step = t.user_attrs["pruned_at_step"]
        assert steps_run(t) == step < 3
        assert t.value == t.intermediate_values[step] == t.params["trainer.max_new_tokens"]  # its last value
    # summary files
    results = OmegaConf.load(pruned_dir / "optimization_results.yaml")
    best = min((t for t in with_pruner if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert results.best_value == best.value and results.trials.PRUNED == len(pruned)
    assert (pruned_dir / "optimization_history.png").stat().st_size > 0
    assert "PRUNED" in (pruned_dir / "summary.md").read_text()
    # the MLflow runs: one per trial, tagged with study and trial; the pruned ones marked PRUNED
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    by_trial = {int(r.data.tags["trial"]): r for r in runs}
    assert sorted(by_trial) == list(range(6))
    for t in with_pruner:
        tags = by_trial[t.number].data.tags
        assert tags["sweep"] == "s" and tags["optuna.study"] == "s"
        assert tags.get("trial_state") == ("PRUNED" if t.state == TrialState.PRUNED else None)
        assert t.user_attrs["tracker_ids"]["mlflow"] == by_trial[t.number].info.run_id


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_resumed_sweep_continues_numbering_and_repeats_no_finished_trial(tmp_path, sweep):
    sweep_dir = tmp_path / "sweep"
    args = [
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.max_new_tokens=choice(2,4,6,8)",
    ]
    sweep(sweep_dir, *args, "hydra.sweeper.n_trials=2")
    first = {
        t.number: (Path(t.user_attrs["job_dir"]) / "metrics.jsonl").stat().st_mtime_ns for t in study(sweep_dir).trials
    }
    assert sorted(first) == [0, 1]
    sweep(sweep_dir, *args, "hydra.sweeper.n_trials=4")
    trials = study(sweep_dir).trials
    assert [t.number for t in trials] == [0, 1, 2, 3] and all(t.state == TrialState.COMPLETE for t in trials)
    for n, mtime in first.items():  # trials 0 and 1 were not run again
        assert (Path(trials[n].user_attrs["job_dir"]) / "metrics.jsonl").stat().st_mtime_ns == mtime
    assert sorted(p.name.split("-")[0] for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1", "2", "3"]
    # the grid sampler saw the first two trials: together the four cover the grid once
    assert sorted(t.params["trainer.max_new_tokens"] for t in trials) == [2, 4, 6, 8]
    sweep(sweep_dir, *args, "hydra.sweeper.n_trials=4")  # nothing left to do
    assert len(study(sweep_dir).trials) == 4


@pytest.mark.long
def test_two_worker_processes_share_one_study(tmp_path):
    sweep_dir = tmp_path / "shared"
    args = [
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.objective=entropy/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.temperature=interval(0.5, 1.5)",
    ]
    cmd = [sys.executable, "-m", "rlexp.cli", *sweep_args(sweep_dir, *args)]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outs)
    trials = study(sweep_dir).trials
    assert [t.number for t in trials] == [0, 1, 2, 3, 4, 5]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.params["trainer.temperature"] for t in trials}) == 6
    assert all(steps_run(t) == 3 for t in trials)  # each trial trained once, in its own job folder
    launched = [
        [
            int(line.split("trial.number=")[1].split()[0])
            for line in o.splitlines()
            if "trial.number=" in line and "#" in line
        ]
        for o in outs
    ]
    assert sorted(launched[0] + launched[1]) == [0, 1, 2, 3, 4, 5], launched
    print("trials launched per worker:", launched)


@pytest.mark.long
def test_a_trial_that_raises_is_recorded_fail_and_the_sweep_completes(tmp_path, sweep):
    sweep_dir = tmp_path / "sweep"
    sweep(
        sweep_dir,
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.max_failure_rate=0.5",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "optimizer.lr=choice(-1.0, 1e-05)",
    )
    trials = {t.params["optimizer.lr"]: t for t in study(sweep_dir).trials}
    assert trials[-1.0].state == TrialState.FAIL and trials[1e-05].state == TrialState.COMPLETE
    assert trials[-1.0].user_attrs["error"].startswith("ConfigError: optimizer.lr=-1.0: must be > 0")
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert results.trials == {"FAIL": 1, "COMPLETE": 1} and results.best_params == {"optimizer.lr": 1e-05}
    assert "Traceback" in trials[-1.0].user_attrs["traceback"]


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_two_objective_sweep_returns_the_pareto_front(tmp_path, sweep):
    sweep_dir = tmp_path / "mo"
    sweep(
        sweep_dir,
        "hydra/sweeper/sampler=nsgaii",
        "hydra.sweeper.sampler.seed=1",
        "hydra.sweeper.n_trials=5",
        "hydra.sweeper.plots=true",
        "hydra.sweeper.objective=[length/mean,entropy/mean]",
        "hydra.sweeper.direction=[minimize,maximize]",
        "trainer.max_new_tokens=choice(2,4,6)",
        "trainer.temperature=interval(0.5, 1.5)",
    )
    s = study(sweep_dir)
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    front = results.solutions
    assert front and sorted(x.number for x in front) == sorted(t.number for t in s.best_trials)
    signs = [1, -1]  # minimise length, maximise entropy

    def dominates(a, b):
        return all(sa * x <= sa * y for sa, x, y in zip(signs, a, b)) and any(
            sa * x < sa * y for sa, x, y in zip(signs, a, b)
        )

    complete = [t for t in s.trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 5
    for x in front:
        assert not any(dominates(t.values, list(x["values"])) for t in complete)
    for t in complete:  # every trial off the front is dominated by a front member
        if t.number not in {x.number for x in front}:
            assert any(dominates(list(x["values"]), t.values) for x in front)
    assert (sweep_dir / "pareto_front.png").stat().st_size > 0


@pytest.mark.slow
def test_joblib_launcher_keeps_n_jobs_trials_in_flight(tmp_path, sweep):
    """Two trials at a time in joblib (loky) worker processes; a new one starts when either ends."""
    sweep_dir = tmp_path / "joblib"
    sweep(
        sweep_dir,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.sweeper.n_jobs=2",
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.max_new_tokens=choice(2,4,6,8)",
    )
    trials = study(sweep_dir).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    spans = [(t.datetime_start, t.datetime_complete) for t in trials]
    overlapping = sum(1 for i, a in enumerate(spans) for b in spans[i + 1 :] if a[0] < b[1] and b[0] < a[1])
    assert overlapping >= 1  # trials ran side by side
    assert all(steps_run(t) == 3 for t in trials)


@pytest.mark.long
def test_default_retention_keeps_only_the_best_trials_checkpoint(tmp_path, sweep, capfd):
    """Three trials, each writing its final checkpoint: once the sweep ends, only the best trial's is on disk;
    the summary names it with its size, and a progress line per trial shows the best so far."""
    sweep_dir = tmp_path / "keep"
    sweep(
        sweep_dir,
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.max_new_tokens=choice(4, 6, 8)",
        "trainer.temperature=0.5",
    )
    trials = study(sweep_dir).trials
    best = min((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    kept = [t.number for t in trials if (Path(t.user_attrs["job_dir"]) / "checkpoints" / "last").exists()]
    assert len(trials) == 3 and kept == [best.number]
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert [k.trial for k in results.weights_kept] == [best.number] and results.weights_kept[0].bytes > 10**6
    assert "Weights kept (" in (sweep_dir / "summary.md").read_text()
    out = capfd.readouterr()
    progress = [line for line in (out.out + out.err).splitlines() if "sweep s " in line and " trials " in line]
    assert "sweep s 3/3 trials" in progress[-1] and f"best 4 (trial {best.number})" in progress[-1]


@pytest.mark.long
def test_keep_weights_all_keeps_every_trials_checkpoint(tmp_path, sweep):
    sweep_dir = tmp_path / "all"
    sweep(
        sweep_dir,
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.keep_weights=all",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.max_new_tokens=choice(4, 6)",
    )
    assert all((Path(t.user_attrs["job_dir"]) / "checkpoints" / "last").exists() for t in study(sweep_dir).trials)


def trial_states(db: Path) -> dict[int, str]:
    """{number: state} read straight from the SQLite file (while another process writes it)."""
    import sqlite3

    if not db.exists():
        return {}
    con = sqlite3.connect(db, timeout=30)
    try:
        return dict(con.execute("SELECT number, state FROM trials").fetchall())
    except sqlite3.OperationalError:  # tables not created yet
        return {}
    finally:
        con.close()


@pytest.mark.long  # a killed sweep subprocess and its rerun (~8 s)
def test_a_sweep_killed_mid_trial_and_rerun_at_once_runs_every_trial(tmp_path, sweep):
    """Issue 16: SIGKILL the sweep while trial 1 trains, re-run the same command at once (well within the
    heartbeat's grace period): trial 1 is failed as interrupted (its sweep process is gone) and run again, so
    the study ends with n_trials COMPLETE trials and none RUNNING; the re-run waits for no grace period."""
    import signal
    import time

    sweep_dir = tmp_path / "killed"
    args = [
        "hydra/sweeper/sampler=random",
        "hydra.sweeper.sampler.seed=0",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.objective=length/mean",
        "hydra.sweeper.direction=minimize",
        "trainer.max_new_tokens=choice(2,4,6,8)",
    ]
    cmd = [sys.executable, "-m", "rlexp.cli", *sweep_args(sweep_dir, *args)]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    try:
        # trial 1's job has started (its job folder exists): the sweep is mid-trial
        while not (trial_states(sweep_dir / "s.db").get(1) == "RUNNING" and list(sweep_dir.glob("1-*"))):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "trial 1 never started"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert trial_states(sweep_dir / "s.db") == {0: "COMPLETE", 1: "RUNNING"}
    started = time.monotonic()
    sweep(sweep_dir, *args)  # the same command, at once
    assert time.monotonic() - started < 120  # not after the default grace period (4 x 30 s)
    trials = study(sweep_dir).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    killed, retry = trials[1], trials[2]
    assert killed.user_attrs["error"] == f"interrupted: its sweep process (pid {proc.pid}) is gone"
    assert retry.user_attrs["retry_of"] == 1 and retry.params == killed.params
    assert steps_run(retry) == 3 and sum(t.state == TrialState.COMPLETE for t in trials) == 2
    results = OmegaConf.load(sweep_dir / "optimization_results.yaml")
    assert results.trials == {"COMPLETE": 2, "FAIL": 1}


def test_an_objective_typo_is_refused_before_any_trial(tmp_path, sweep, capfd):
    """Issue 16: a misspelt objective stops the sweep before the first trial trains, in one line naming the
    key, the name and the closest metric names; no job ran, no study was created."""
    sweep_dir = tmp_path / "typo"
    with pytest.raises(SystemExit) as e:
        sweep(
            sweep_dir,
            "eval.size=2",
            "hydra.sweeper.objective=eval/acuracy",
            "hydra.sweeper.direction=maximize",
            "trainer.max_new_tokens=choice(2,4)",
        )
    assert e.value.code == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].startswith(
        "error: hydra.sweeper.objective: 'eval/acuracy' is not a metric these trials return; closest: eval/accuracy"
    ), err
    assert not sweep_dir.exists()  # no job folder, no study


def test_an_eval_objective_without_evaluation_is_refused_before_any_trial(tmp_path, sweep, capfd):
    with pytest.raises(SystemExit):
        sweep(
            tmp_path / "noeval",
            "hydra.sweeper.objective=[reward/accuracy/mean,eval/accuracy]",
            "hydra.sweeper.direction=[maximize,maximize]",
            "trainer.max_new_tokens=choice(2,4)",
        )
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert err == [
        "error: hydra.sweeper.objective: 'eval/accuracy' needs evaluation, which these trials do not run "
        "(eval.size=0, no +benchmark): set eval.size > 0 or add +benchmark=<entry> "
        "(hydra.sweeper.check_objective=false skips this check)"
    ]
    assert not (tmp_path / "noeval").exists()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["optimizer.lr=tag(log, interval(0, 1e-4))"],
            "optimizer.lr=tag(log, interval(0, 1e-4)): a log scale needs a lower bound > 0 (got 0.0)",
        ),
        (
            ["trainer.temperature=interval(1.5, 0.5)"],
            "trainer.temperature=interval(1.5, 0.5): the lower bound 1.5 is above the upper bound 0.5",
        ),
        (  # a ready sweep's searched key, its interval inverted on the command line
            ["+sweep=grpo_lr_clip", "algorithm.loss.eps_low=interval(0.3, 0.1)"],
            "algorithm.loss.eps_low=interval(0.3, 0.1): the lower bound 0.3 is above the upper bound 0.1",
        ),
    ],
)
def test_a_bad_interval_is_one_line_naming_the_parameter(tmp_path, sweep, capfd, overrides, message):
    """Issue 16: a log-scale interval from <= 0 or an inverted interval stops the sweep before any trial, in
    one line naming the parameter, not inside Optuna (hydra.sweeper.params entries: test_sweep_search_space)."""
    with pytest.raises(SystemExit) as e:
        sweep(tmp_path / "bad", "hydra.sweeper.objective=length/mean", *overrides)
    assert e.value.code == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error:")]
    assert err == [f"error: {message}"]
    assert not (tmp_path / "bad").exists()
