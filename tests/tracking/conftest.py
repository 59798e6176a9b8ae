"""Tracking test helpers: a real ``mlflow server`` on loopback (SQLite backend, or PostgreSQL when a
``postgresql://`` URI is given) that a test can kill, restart, pause (SIGSTOP) and resume."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

HTTP_VARS = (
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER",
    "MLFLOW_TRACKING_URI",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` in its own process group (so its workers go with it) on 127.0.0.1."""

    def __init__(self, root: Path, backend_uri: str | None = None, port: int | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.backend_uri = backend_uri or f"sqlite:///{self.root / 'mlflow.db'}"
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> MlflowServer:
        self.starts += 1
        log = open(self.root / f"server-{self.starts}.log", "w")
        mlflow_bin = str(Path(sys.executable).parent / "mlflow")
        self.proc = subprocess.Popen(
            [
                mlflow_bin,
                "server",
                "--backend-store-uri",
                self.backend_uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--artifacts-destination",
                str(self.root / "artifacts"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.root,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited ({self.proc.returncode}): "
                    f"{(self.root / f'server-{self.starts}.log').read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.kill()
        raise TimeoutError(f"mlflow server on {self.url} not healthy after {timeout} s")

    def _signal(self, sig) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the server and its workers (an abrupt outage)."""
        if self.proc is None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung server)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)


@pytest.fixture(scope="module")
def _module_server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.kill()


@pytest.fixture
def mlflow_server(_module_server):
    """A running server (SQLite backend) shared by a module's tests (starting one takes seconds): a
    test may kill, pause or restart it; it is running again (same port and database) for the next."""
    yield _module_server
    if _module_server.proc is None or _module_server.proc.poll() is not None:
        _module_server.start()
    else:
        _module_server.resume()


@pytest.fixture
def make_mlflow_server(tmp_path):
    """``make(backend_uri=None)`` → a started server; every one is killed at teardown."""
    servers = []

    def make(backend_uri: str | None = None, name: str = "server") -> MlflowServer:
        servers.append(MlflowServer(tmp_path / name, backend_uri).start())
        return servers[-1]

    yield make
    for s in servers:
        s.kill()


@pytest.fixture(autouse=True)
def _restore_mlflow_env():
    """The MLflow tracker shortens MLflow's HTTP waits through environment variables: undo that."""
    saved = {k: os.environ.get(k) for k in HTTP_VARS}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def postgres_uri():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth) with an empty ``mlflow`` database;
    skipped where the PostgreSQL server binaries or psycopg (``pip install -e '.[postgres]'``) are
    missing."""
    import importlib.util
    import shutil
    import tempfile

    tools = {n: shutil.which(n) for n in ("initdb", "pg_ctl", "psql")}
    if not all(tools.values()):
        pytest.skip(f"PostgreSQL binaries missing: {[n for n, p in tools.items() if not p]}")
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg missing (pip install -e '.[postgres]')")
    root = Path(tempfile.mkdtemp(prefix="rlexp-pg-"))
    as_pg: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        import pwd

        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no 'postgres' user to run PostgreSQL as")
        os.chown(root, pg.pw_uid, pg.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data, log = root / "data", root / "server.log"

    def sh(*cmd):
        subprocess.run([*as_pg, *cmd], check=True, capture_output=True, text=True, timeout=120)

    try:
        sh(tools["initdb"], "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
        sh(
            tools["pg_ctl"],
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "-o",
            f"-p {port} -h 127.0.0.1 -k {root} -F",
            "start",
        )
        sh(tools["psql"], "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-c", "CREATE DATABASE mlflow")
        yield f"postgresql://postgres@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(
            [*as_pg, tools["pg_ctl"], "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60
        )
        shutil.rmtree(root, ignore_errors=True)
