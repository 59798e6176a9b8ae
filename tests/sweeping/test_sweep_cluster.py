"""Cluster launchers (issue 18), from the `cluster` extra: a sweep of the tiny model (1 step a trial) through
submitit's local executor (``hydra/launcher=submitit_local``: each trial a submitit job, its own Python process)
and through a local Ray cluster (``hydra/launcher=rlexp_ray``: each trial a Ray task in a Ray worker process),
two trials at a time; every trial's job writes to the one Optuna storage named by ``hydra.sweeper.storage`` (a
journal file for submitit, SQLite for Ray). Each sweep's grid has one invalid value, so one trial fails in its
worker and the other four still complete. Our Ray launcher also passes Hydra's own launcher test suite. The SLURM
example config composes to submitit's SlurmLauncher and writes the sbatch script it documents (no SLURM cluster here:
the script is captured where sbatch would be called).

Times on a busy 2-core CPU: the submitit sweep 45-65 s, the Ray sweep ~40 s, the launcher suite ~25 s (10 tests)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.test_utils.launcher_common_tests import LauncherTestSuite
from hydra.utils import instantiate
from optuna.trial import TrialState

from rlexp.cli import main as rlexp_main
from rlexp.config.paths import CONF_DIR
from tests.sweeping.test_sweep_tiny import TRIAL as TINY_TRIAL

REPO = Path(__file__).resolve().parents[2]
EXTRA = "pip install -e '.[cluster]'"
HAS_SUBMITIT = importlib.util.find_spec("submitit") is not None and (
    importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
)
HAS_RAY = importlib.util.find_spec("ray") is not None
needs_submitit = pytest.mark.skipif(not HAS_SUBMITIT, reason=f"the cluster extra is not installed ({EXTRA})")
needs_ray = pytest.mark.skipif(not HAS_RAY, reason=f"the cluster extra is not installed ({EXTRA})")

# a local Ray cluster of 2 CPUs with a small object store (trials pass only configs and results through it)
RAY_LOCAL = ["hydra.launcher.ray.init.num_cpus=2", f"hydra.launcher.ray.init.object_store_memory={80 * 2**20}"]
# test_sweep_tiny's trial, one step long
TRIAL = [o if o != "trainer.max_steps=3" else "trainer.max_steps=1" for o in TINY_TRIAL]
# grid: 0 fails the job's config check (trainer.max_new_tokens must be > 0) in its worker; the four others complete
SWEEP = [
    "hydra/sweeper=rlexp_optuna",
    "hydra.sweeper.plots=false",
    "hydra.sweeper.study_name=s",
    "hydra/sweeper/sampler=grid",
    "hydra.sweeper.n_jobs=2",
    "hydra.sweeper.max_failure_rate=0.2",
    "hydra.sweeper.objective=length/mean",
    "hydra.sweeper.direction=minimize",
    "hydra.sweeper.keep_weights=none",
    "trainer.max_new_tokens=choice(0,2,4,6,8)",
]


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    threads = torch.get_num_threads()

    def run(sweep_dir: Path, storage: str, *args: str) -> optuna.Study:
        rlexp_main(
            ["train", "-m", *SWEEP, f"hydra.sweep.dir={sweep_dir}", f"hydra.sweeper.storage={storage}", *TRIAL, *args]
        )
        from rlexp.sweeping.storage import open_storage, resolve_storage

        return optuna.load_study(study_name="s", storage=open_storage(resolve_storage(storage, sweep_dir, "s")))

    yield run
    torch.set_num_threads(threads)


def check_study(study: optuna.Study) -> list:
    """Four trials COMPLETE with their objective (an untrained tiny model writes max_new_tokens tokens), the
    invalid one FAIL with the job's own error; each job reported to its trial from its worker process."""
    trials = study.trials
    assert len(trials) == 5 and len({t.number for t in trials}) == 5
    failed = [t for t in trials if t.state == TrialState.FAIL]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert [t.params["trainer.max_new_tokens"] for t in failed] == [0]
    assert failed[0].user_attrs["error"].startswith("ConfigError: trainer.max_new_tokens=0"), failed[0].user_attrs
    assert sorted(t.params["trainer.max_new_tokens"] for t in complete) == [2, 4, 6, 8]
    for t in complete:
        assert t.value == t.params["trainer.max_new_tokens"]
        assert t.intermediate_values == {1: t.value} or t.intermediate_values == {0: t.value}, t.intermediate_values
        assert Path(t.user_attrs["run_dir"]) == Path(t.user_attrs["job_dir"]).resolve()
        assert (Path(t.user_attrs["job_dir"]) / "metrics.jsonl").read_text().count("\n") == 1
    spans = [(t.datetime_start, t.datetime_complete) for t in trials]
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1 :])  # side by side
    return complete


@pytest.mark.long
@needs_submitit
def test_submitit_local_sweep_on_one_journal_storage(tmp_path, sweep):
    sweep_dir = tmp_path / "submitit"
    study = sweep(
        sweep_dir,
        f"journal:{tmp_path}/shared/study.log",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
    )
    check_study(study)
    results = sorted((sweep_dir / ".submitit").glob("*/*_result.pkl"))
    assert len(results) == 5  # each trial was a submitit job (its own process)


@pytest.fixture
def ray_cluster():
    import ray

    yield
    ray.shutdown()


@pytest.mark.long
@needs_ray
def test_ray_sweep_on_a_local_cluster_and_one_sqlite_storage(tmp_path, sweep, ray_cluster):
    import ray

    sweep_dir = tmp_path / "ray"
    study = sweep(
        sweep_dir,
        f"sqlite:///{tmp_path}/shared/study.db",
        "hydra/launcher=rlexp_ray",
        *RAY_LOCAL,
    )
    check_study(study)
    # the launcher's local cluster outlives the sweeper's launch threads (Ray kills its head processes when the
    # thread that started them ends): every process of it still runs, and it has the 2 CPUs asked for
    head = ray._private.worker._global_node.all_processes
    assert head and all(p.process.poll() is None for infos in head.values() for p in infos), head
    assert ray.is_initialized() and ray.cluster_resources()["CPU"] == 2


def compose_launcher(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


class Submitted(Exception):
    """Raised in place of sbatch: the submission stops there."""


@needs_submitit
def test_the_slurm_example_writes_the_sbatch_script_it_documents(tmp_path, monkeypatch):
    """hydra/launcher=slurm composes to submitit's SlurmLauncher; its launch writes an sbatch script with the
    documented keys (partition, GPUs, time, CPUs, memory, setup lines), captured instead of calling sbatch."""
    from submitit.slurm.slurm import SlurmExecutor

    cfg = compose_launcher(
        "hydra/launcher=slurm",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.setup=[module load cuda]",
        f"hydra.sweep.dir={tmp_path}",
    )
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "SlurmLauncher" and launcher.params["max_num_timeout"] == 0
    scripts = []

    def submit(self, command):
        scripts.append(self._make_submission_file_text(command, "uid"))
        raise Submitted

    monkeypatch.setattr(SlurmExecutor, "_submit_command", submit)
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # as if srun were on the PATH
    launcher.setup(hydra_context=None, task_function=lambda c: 0, config=cfg)
    with pytest.raises(Submitted):
        launcher.launch([["trainer.seed=1"]], initial_job_idx=0)
    lines = set(scripts[0].splitlines())
    expected = ["--partition=gpu", "--gpus-per-node=1", "--time=240", "--cpus-per-task=8", "--mem=64GB", "--nodes=1"]
    assert {f"#SBATCH {x}" for x in expected} <= lines, scripts[0]
    assert "module load cuda" in lines and any(line.startswith("#SBATCH --output=" + str(tmp_path)) for line in lines)
    assert compose_launcher("hydra/launcher=slurm").hydra.launcher.partition is None  # the cluster's default


def test_the_ray_launcher_config_composes_without_importing_ray():
    """Hydra imports every plugin on every run: composing and instantiating the launcher must not import Ray (it
    is imported when a sweep launches), so a default install without the extra is unaffected."""
    code = """
import sys
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from rlexp.config.paths import CONF_DIR  # registers the train config's schema
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    cfg = compose(config_name="config", overrides=["hydra/launcher=rlexp_ray", "hydra.launcher.ray.remote.num_gpus=1"],
                  return_hydra_config=True)
launcher = instantiate(cfg.hydra.launcher)
assert type(launcher).__name__ == "RLExpRayLauncher", launcher
assert cfg.hydra.launcher.ray.init.address == "local" and cfg.hydra.launcher.ray.remote.max_retries == 0
from hydra_plugins.rlexp_ray_launcher.ray_launcher import _options
assert _options(cfg.hydra.launcher.ray.remote) == {"num_cpus": 1, "num_gpus": 1, "max_retries": 0}
assert "ray" not in sys.modules
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="class")
def hydra_suite_state():
    """Hydra's suite expects no version_base set yet in this process (Hydra 1.1 behaviour: jobs chdir to their
    folder); an rlexp sweep before it sets 1.3. Ray is shut down after the suite."""
    from hydra.version import _UNSPECIFIED_, VersionBase

    saved = VersionBase.instance().version_base
    VersionBase.instance().version_base = _UNSPECIFIED_
    yield
    VersionBase.instance().version_base = saved
    if HAS_RAY:
        import ray

        ray.shutdown()


@pytest.mark.long
@needs_ray
@pytest.mark.usefixtures("hydra_suite_state")
@pytest.mark.parametrize(
    "launcher_name, overrides",
    [("rlexp_ray", RAY_LOCAL)],
)
class TestHydrasLauncherSuite(LauncherTestSuite):
    """Hydra's own launcher test suite (hydra.test_utils, the suite hydra's launcher plugins pass): one and two
    jobs a launch, overrides, custom resolvers, a bad key raising, job folders and their .hydra files."""

    def test_a_job_whose_worker_dies_is_an_error_not_a_silent_rerun(
        self, hydra_sweep_runner, launcher_name, overrides, tmp_path
    ):
        """max_retries=0 (our default): a job whose worker process dies (OOM kill, lost node) raises from launch,
        so the sweeper records the trial FAIL; with Ray's retries the same job would be re-run from scratch."""
        import ray

        marker = tmp_path / "died_once"

        def dies_once(_cfg):
            if not marker.exists():
                marker.touch()
                os._exit(3)
            return 7

        def sweep(*extra):
            return hydra_sweep_runner(
                calling_file=None,
                calling_module="hydra.test_utils.a_module",
                task_function=dies_once,
                config_path="configs",
                config_name="compose.yaml",
                overrides=[f"hydra/launcher={launcher_name}", *overrides, *extra],
                temp_dir=tmp_path,
            )

        with pytest.raises(ray.exceptions.WorkerCrashedError):
            with sweep():
                pass
        assert marker.exists()
        marker.unlink()
        with sweep("hydra.launcher.ray.remote.max_retries=1") as retried:  # died once, then ran again
            assert retried.returns[0][0].return_value == 7 and marker.exists()
