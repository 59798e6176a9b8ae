"""Issue 16: a half-migrated SQLite MLflow store is repaired (after a backup copy) or refused with one line that
says how to recover without losing runs.

The broken stores are real: MLflow's own migration of the file, killed (SIGKILL-like ``os._exit``) right after a
chosen SQL statement ran, which is what a Ctrl-C, an OOM kill or two processes migrating one fresh file leave.
MLflow itself then fails on every open (``duplicate column name: step``, ``table _alembic_tmp_tags already
exists``)."""

import hashlib
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlexp.tracking.mlflow_tracker import MLflowTracker, open_client
from rlexp.tracking.sqlite_store import (
    StoreError,
    head_revision,
    prepare_store,
    reference_schemas,
    revisions,
    schema,
)

# MLflow opening (creating / migrating) a store, killed at once after the first statement matching argv[2] ran
KILLED_MIGRATION = """
import os, re, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine

pattern = re.compile(sys.argv[2], re.I)


@event.listens_for(Engine, "after_cursor_execute")
def _kill(conn, cursor, statement, *a):
    if pattern.search(statement):
        os._exit(9)


from mlflow import MlflowClient

MlflowClient("sqlite:///" + sys.argv[1]).search_experiments()
"""

MLFLOW_OPEN = """
import sys
from mlflow import MlflowClient

MlflowClient("sqlite:///" + sys.argv[1]).search_experiments()
"""

RUN = "a" * 32


def kill_migration(db: Path, statement: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_MIGRATION, str(db), statement], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 9, f"the migration was not killed at {statement!r}: {proc.stderr[-2000:]}"


def mlflow_open_error(db: Path) -> str:
    """What MLflow itself says when it opens (a copy of) the store: '' when it opens."""
    copy = db.with_name("copy-" + db.name)
    copy.write_bytes(db.read_bytes())
    proc = subprocess.run([sys.executable, "-c", MLFLOW_OPEN, str(copy)], capture_output=True, text=True, timeout=300)
    copy.unlink()
    return "" if proc.returncode == 0 else proc.stderr


def revision(db: Path) -> str | None:
    with closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT version_num FROM alembic_version").fetchall()
    return rows[0][0] if rows else None


def at_head(db: Path) -> bool:
    with closing(sqlite3.connect(db)) as con:
        return revision(db) == head_revision() and schema(con) == reference_schemas()[-1][1]


def digest(db: Path) -> str:
    return hashlib.sha256(db.read_bytes()).hexdigest()


def old_store_with_a_run(db: Path) -> None:
    """A store as MLflow 1.0 created it (its initial tables, before any migration) holding one run: params, a
    tag and three metric values."""
    import sqlalchemy
    from mlflow.store.db.utils import InitialBase

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)
    engine.dispose()
    art = (db.parent / "art").as_uri()
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("INSERT INTO experiments VALUES (0, 'Default', ?, 'active')", (art,))
        con.execute("INSERT INTO experiments VALUES (1, 'old', ?, 'active')", (art,))
        con.execute(
            "INSERT INTO runs VALUES (?, 'old-run', 'LOCAL', 'train.py', '', 'me', 'FINISHED', 1000, 9000, '', "
            "'active', ?, 1)",
            (RUN, art),
        )
        con.executemany("INSERT INTO metrics VALUES ('loss', ?, ?, ?)", [(0.5, 1001, RUN), (0.4, 1002, RUN)])
        con.execute("INSERT INTO metrics VALUES ('loss', 0.3, 1003, ?)", (RUN,))
        con.execute("INSERT INTO params VALUES ('lr', '0.1', ?)", (RUN,))
        con.execute("INSERT INTO tags VALUES ('seed', '7', ?)", (RUN,))


def assert_the_old_run_is_there(uri: str) -> None:
    client = MlflowClient(uri)
    r = client.get_run(RUN)
    assert r.info.status == "FINISHED" and r.data.params == {"lr": "0.1"} and r.data.tags["seed"] == "7"
    assert sorted(m.value for m in client.get_metric_history(RUN, "loss")) == [0.3, 0.4, 0.5]


@pytest.mark.long  # killed migration subprocesses (~10 s each)
@pytest.mark.parametrize(
    "statement, mlflow_says",
    [
        ("ALTER TABLE metrics ADD COLUMN step", "duplicate column name: step"),
        ("CREATE TABLE _alembic_tmp_tags", "table _alembic_tmp_tags already exists"),
    ],
)
def test_a_migration_killed_on_a_fresh_store_is_undone_and_completed(tmp_path, statement, mlflow_says):
    db = tmp_path / "mlruns.db"
    kill_migration(db, statement)
    assert mlflow_says in mlflow_open_error(db)  # MLflow alone never opens it again
    uri = f"sqlite:///{db}"
    t = MLflowTracker(uri, experiment="e", artifact_location=str(tmp_path / "art"), start_timeout=5)
    run_id = t.start("r", {}, {"p": "1"}, {"run_dir": str(tmp_path)})
    t.log_metrics({"m": 1.0}, 1)
    t.finish()
    assert run_id and MlflowClient(uri).get_run(run_id).info.status == "FINISHED"
    assert at_head(db)
    assert len(list(tmp_path.glob("mlruns.db.bak-*"))) == 1  # the copy taken before the repair
    assert mlflow_open_error(db) == ""


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_a_half_migrated_store_is_repaired_and_keeps_its_runs(tmp_path, caplog):
    db = tmp_path / "mlruns.db"
    old_store_with_a_run(db)
    kill_migration(db, "ALTER TABLE metrics ADD COLUMN step")  # the upgrade of the old store, killed
    assert "duplicate column name: step" in mlflow_open_error(db)
    with caplog.at_level("WARNING"):
        client = open_client(f"sqlite:///{db}")
    assert client is not None and at_head(db)
    assert_the_old_run_is_there(f"sqlite:///{db}")
    (copy,) = tmp_path.glob("mlruns.db.bak-*")
    with closing(sqlite3.connect(copy)) as con:  # the copy is the store as it was: the run, the added column
        assert con.execute("SELECT COUNT(*) FROM metrics WHERE run_uuid = ?", (RUN,)).fetchone()[0] == 3
        assert "step" in [r[1] for r in con.execute("PRAGMA table_info(metrics)")]
    said = [r.getMessage() for r in caplog.records if "half-migrated" in r.getMessage()]
    assert said and "metrics.step" in said[0] and str(copy) in said[0]


@pytest.mark.long
def test_a_whole_migration_whose_stamp_was_lost_is_stamped(tmp_path):
    db = tmp_path / "mlruns.db"
    uri = f"sqlite:///{db}"
    client = open_client(uri)
    run_id = client.create_run(client.create_experiment("e", str(tmp_path / "art"))).info.run_id
    with closing(sqlite3.connect(db)) as con, con:  # the last migration ran, its alembic_version update did not
        con.execute("UPDATE alembic_version SET version_num = ?", (revisions()[-2],))
    assert "out-of-date database schema" in mlflow_open_error(db)
    open_client(uri)
    assert at_head(db) and MlflowClient(uri).get_run(run_id).info.run_id == run_id
    assert len(list(tmp_path.glob("mlruns.db.bak-*"))) == 1


def test_a_store_it_cannot_repair_is_refused_in_one_line_and_left_untouched(tmp_path):
    """Simulated: a table dropped midway with its rows in alembic's copy (no safe undo)."""
    db = tmp_path / "mlruns.db"
    old_store_with_a_run(db)
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("ALTER TABLE tags RENAME TO _alembic_tmp_tags")
    before = digest(db)
    with pytest.raises(StoreError) as e:
        open_client(f"sqlite:///{db}")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{db}: half-migrated MLflow store")
    assert "tags dropped midway (its rows are in _alembic_tmp_tags)" in msg
    assert f"cp {db} {db}.broken" in msg and "rlexp replay <run_dir> --tracking-uri" in msg
    assert digest(db) == before and not list(tmp_path.glob("mlruns.db.bak-*"))


def test_a_store_from_a_newer_mlflow_is_refused_at_once_and_left_untouched(tmp_path):
    db = tmp_path / "mlruns.db"
    open_client(f"sqlite:///{db}")
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    before = digest(db)
    t = MLflowTracker(f"sqlite:///{db}", experiment="e", start_timeout=60)
    began = time.monotonic()
    with pytest.raises(StoreError, match="ffffffffffff, which MLflow .* does not know"):
        t.start("r", {}, {}, {})
    assert time.monotonic() - began < 30  # refused, not retried for start_timeout
    assert digest(db) == before


@pytest.mark.long
def test_a_store_behind_that_mlflow_refuses_names_the_upgrade_command(tmp_path, monkeypatch):
    """MLflow migrates a store behind it by itself only when it lacks tables; one with all its tables but old
    columns it refuses. (No revision of this MLflow has all the head's tables, so the table set is narrowed.)"""
    import rlexp.tracking.sqlite_store as store

    db = tmp_path / "mlruns.db"
    old_store_with_a_run(db)
    monkeypatch.setattr(store, "mlflow_tables", lambda: {"experiments", "runs", "metrics", "params", "tags"})
    with pytest.raises(StoreError) as e:
        prepare_store(db)
    msg = str(e.value)
    assert f"cp {db} {db}.bak" in msg
    command = msg.split("then migrate it: ")[1]
    assert command == f"mlflow db upgrade sqlite:///{db}"
    mlflow_bin = str(Path(sys.executable).parent / "mlflow")
    subprocess.run([mlflow_bin, *command.split()[1:]], check=True, capture_output=True, timeout=300)
    monkeypatch.undo()
    assert prepare_store(db) is None and at_head(db)
    assert_the_old_run_is_there(f"sqlite:///{db}")


def test_an_old_store_is_migrated_after_a_backup(tmp_path):
    db = tmp_path / "mlruns.db"
    old_store_with_a_run(db)
    open_client(f"sqlite:///{db}")
    assert at_head(db)
    assert_the_old_run_is_there(f"sqlite:///{db}")
    (copy,) = tmp_path.glob("mlruns.db.bak-*")
    with closing(sqlite3.connect(copy)) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1


def test_a_store_unlike_the_reference_but_with_nothing_of_a_later_migration_is_migrated(tmp_path):
    """An older MLflow's build of a revision may differ from this one's (here: an index of its own); with
    nothing of a later revision in it, it is no half-migration: migrated as MLflow would, after a copy."""
    db = tmp_path / "mlruns.db"
    old_store_with_a_run(db)
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("CREATE INDEX idx_params_value ON params (value)")
    open_client(f"sqlite:///{db}")
    assert revision(db) == head_revision()
    assert_the_old_run_is_there(f"sqlite:///{db}")
    assert len(list(tmp_path.glob("mlruns.db.bak-*"))) == 1


def test_an_unrepairable_store_without_runs_is_set_aside(tmp_path):
    db = tmp_path / "mlruns.db"
    old_store_with_a_run(db)
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("DELETE FROM metrics")
        con.execute("DELETE FROM params")
        con.execute("DELETE FROM tags")
        con.execute("DELETE FROM runs")
        con.execute("ALTER TABLE tags RENAME TO _alembic_tmp_tags")
    open_client(f"sqlite:///{db}")
    assert at_head(db)
    (aside,) = tmp_path.glob("mlruns.db.bak-*")
    with closing(sqlite3.connect(aside)) as con:  # kept as it was
        assert con.execute("SELECT name FROM experiments WHERE experiment_id = 1").fetchone() == ("old",)
