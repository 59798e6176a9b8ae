"""Optuna storages by URL, shared by the sweeper process and the training jobs it launches.

- ``None`` → ``sqlite:///<sweep dir>/<study>.db`` (one SQLite file per study beside the job folders);
- any SQLAlchemy URL (``sqlite:///path.db``, ``postgresql://user:pw@host/db``, ``mysql+pymysql://...``)
  → :class:`optuna.storages.RDBStorage` (SQLite with a long busy-timeout: many processes write to it);
- ``journal:<path>`` → :class:`optuna.storages.JournalStorage` on an append-only journal file
  (for NFS-style shared file systems where SQLite locking is unreliable).

Relative paths are made absolute, so a job that changes directory still reaches the same file.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

JOURNAL = "journal:"
SQLITE = "sqlite:///"
SQLITE_TIMEOUT_S = 120


def default_storage(sweep_dir: str | Path, study_name: str) -> str:
    safe = re.sub(r"[^\w.-]+", "_", study_name)
    return SQLITE + str((Path(sweep_dir) / f"{safe}.db").absolute())


def resolve_storage(storage: str | None, sweep_dir: str | Path, study_name: str) -> str:
    """The absolute storage URL a sweep uses (see the module docstring)."""
    if storage is None or str(storage).strip() == "":
        return default_storage(sweep_dir, study_name)
    storage = str(storage)
    if storage.startswith(JOURNAL):
        path = storage[len(JOURNAL) :]
        if not path:
            raise ValueError("hydra.sweeper.storage=journal: needs a file path, e.g. journal:sweeps/study.log")
        return JOURNAL + str(Path(path).expanduser().absolute())
    if storage.startswith(SQLITE):
        path = storage[len(SQLITE) :]
        if path and path != ":memory:" and not path.startswith("/"):
            return SQLITE + str(Path(path).absolute())
        if path == ":memory:" or not path:
            raise ValueError(
                f"hydra.sweeper.storage={storage}: an in-memory study cannot be shared with the "
                "training jobs; use a file (or leave storage null for <sweep dir>/<study>.db)"
            )
    if "://" not in storage:
        raise ValueError(
            f"hydra.sweeper.storage={storage!r}: expected a database URL (sqlite:///..., "
            "postgresql://...) or journal:<path>"
        )
    return storage


def local_file(url: str) -> Path | None:
    """The file behind a SQLite or journal URL (None for a database server)."""
    if url.startswith(JOURNAL):
        return Path(url[len(JOURNAL) :])
    if url.startswith(SQLITE):
        return Path(url[len(SQLITE) :])
    return None


def open_storage(url: str):
    """An Optuna storage object for a resolved URL (creates the file's folder if needed)."""
    import optuna

    path = local_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend(str(path)))
    engine_kwargs = (
        {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    )
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def storage_lock(url: str):
    """A cross-process lock around "count the trials, then create one" for file storages, so that
    workers sharing a study never create more than ``n_trials`` trials. Database servers get no lock
    (there the count is exact unless two workers create a trial within the same instant)."""
    path = local_file(url)
    if path is None:
        return contextlib.nullcontext()
    from filelock import FileLock

    return FileLock(str(path) + ".sweep-lock")  # not ".lock": Optuna's journal backend locks that name


def redact(url: str) -> str:
    """The URL without a password, for logs and result files."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
