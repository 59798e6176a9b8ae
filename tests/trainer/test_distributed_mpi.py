"""accelerate's own CPU multi-process mode: ``accelerate launch --cpu --num_processes 2 --mpirun_hostfile <file>``
runs the script under mpirun (MPICH from PyPI: ``pip install -e '.[mpi]'``), and ``PartialState`` builds the gloo
process group from the MPI launcher's variables (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ...).

Unit test (default suite): the MPI size counts as the launched world; ``--cpu --num_processes 2`` without a hostfile
(accelerate then starts one process) is refused instead of training on one process.

Long test: 2 MPI-launched CPU processes on ``model=tiny`` log the loss and reward of one process on the same data and
seed (``distributed.sampling_seed=group``), in one MLflow run, with ``world_size`` 2 in the checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from rlexp.config.schema import ConfigError
from rlexp.trainer.distributed import WORLD_SIZE_VARS, launched_world_size, setup
from tests.trainer.test_distributed import (
    VENV_BIN,
    _assert_equal_steps,
    _cfg,
    _free_port,
    _launch,
    _mlflow_runs,
)

# the venv's bin first: accelerate looks mpirun / mpiexec up on PATH (the mpi extra installs MPICH's there)
PATH = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
MPIRUN = shutil.which("mpirun", path=PATH) or shutil.which("mpiexec", path=PATH)


def _clear_launch_env(monkeypatch):
    for name in (*WORLD_SIZE_VARS, "ACCELERATE_USE_CPU", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)


def test_mpi_size_is_the_world_and_a_hostfileless_cpu_launch_is_refused(monkeypatch):
    _clear_launch_env(monkeypatch)
    monkeypatch.setenv("PMI_SIZE", "2")  # MPICH / Intel MPI under mpirun
    assert launched_world_size() == 2
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # `accelerate launch --cpu` with one process: no MASTER_ADDR
    assert launched_world_size() == 1
    # `accelerate launch --cpu --num_processes 2` without --mpirun_hostfile: one process, MASTER_ADDR set, no size
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for strategy in ("ddp", "none"):
        with pytest.raises(ConfigError, match="started one process: .*--mpirun_hostfile"):
            setup(_cfg(strategy), torch.device("cpu"))


def _hostfile(path) -> str:
    """Two slots on this machine, in the launcher's format (MPICH's hydra: ``host:n``; Open MPI: ``host slots=n``)."""
    version = subprocess.run([MPIRUN, "--version"], capture_output=True, text=True, timeout=30).stdout
    path.write_text("localhost slots=2\n" if "Open MPI" in version else "localhost:2\n")
    return str(path)


@pytest.mark.long
@pytest.mark.skipif(MPIRUN is None, reason="no mpirun/mpiexec on PATH: pip install -e '.[mpi]' (MPICH)")
def test_mpirun_launched_cpu_processes_log_the_single_process_run(tmp_path, monkeypatch):
    """`accelerate launch --num_processes 2 --cpu --mpirun_hostfile` (2 processes under mpirun, gloo) logs the
    steps of one process on the same data and seed, in one MLflow run; the checkpoint records 2 processes."""
    monkeypatch.setenv("PATH", PATH)  # _launch passes os.environ on
    single = _launch(
        [sys.executable, "-m", "rlexp.cli"], ["trainer.max_steps=2"], tmp_path / "one", tmp_path / "one.db"
    )
    assert [r["step"] for r in single] == [1, 2]
    assert single[0]["reward/std"] > 0 and single[0]["grad_norm"] > 0  # a real update

    accelerate = [
        str(VENV_BIN / "accelerate"),
        "launch",
        "--num_processes",
        "2",
        "--cpu",
        "--mpirun_hostfile",
        _hostfile(tmp_path / "hostfile"),
        "--main_process_port",
        str(_free_port()),
        "-m",
        "rlexp.cli",
    ]
    run_dir, db = tmp_path / "two", tmp_path / "two.db"
    two = _launch(accelerate, ["trainer.max_steps=2"], run_dir, db)
    assert [r["step"] for r in two] == [1, 2]
    _assert_equal_steps(single, two)  # loss/total, reward/mean and the rest of COMPARED, within REL
    client, runs = _mlflow_runs(db)
    assert len(runs) == 1, "only the main process creates a tracker run"
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "loss/total")) == [1, 2]
    saved = json.loads((run_dir / "checkpoints" / "last" / "trainer.json").read_text())
    assert saved["step"] == 2 and saved["world_size"] == 2
