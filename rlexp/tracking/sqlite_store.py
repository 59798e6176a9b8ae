"""A SQLite MLflow store checked before MLflow opens it: behind, half-migrated or newer than this MLflow.

MLflow migrates a SQLite store with alembic, one migration after another, and SQLite commits a migration's
statements as they run: a migration killed midway (Ctrl-C, OOM, two processes migrating one fresh file) leaves
its first statements applied and ``alembic_version`` at the previous revision. MLflow then runs that migration
again and fails for good (``duplicate column name: step``, ``table _alembic_tmp_tags already exists``).

``prepare_store(db)`` runs before MLflow opens the file (``open_client`` calls it under the store's lock):

- a missing or empty file, or a store at this MLflow's head revision with all its tables: nothing to do (the
  fast path: two queries);
- a store at an older revision whose schema is that revision's: MLflow would migrate it (tables missing) or
  refuse it (all tables there, columns old). The first is done here after a backup copy; the second is refused
  with the ``mlflow db upgrade`` command;
- a half-migrated store: its schema is compared with the schema of every revision from its own to the head
  (built once per process by running MLflow's migrations on a scratch file). If it is exactly a later
  revision's (whole migrations ran, the stamp did not), the revision is stamped; if it is its own revision's
  plus what the interrupted migration added (tables, columns, indexes that a later revision has, and alembic's
  ``_alembic_tmp_<table>`` copies of tables still there), those additions are removed in one transaction and
  checked against the revision's schema. Either way a copy is made first (``<db>.bak-<time>``), the migration
  is then completed, and a failure restores the copy. Anything else beside such additions (a table dropped
  midway, a changed primary key) is refused: one line that names the file, what is wrong and how to recover
  without losing runs (a store without runs is set aside instead, and MLflow creates a new one). A store unlike
  the reference but with nothing of a later revision (an older MLflow built it) counts as behind;
- a revision this MLflow does not know (a newer MLflow wrote it): refused, untouched.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import tempfile
import time
from contextlib import closing
from pathlib import Path

log = logging.getLogger(__name__)

TMP_PREFIX = "_alembic_tmp_"


class StoreError(RuntimeError):
    """A tracking store that cannot be used as it is; the message is one line that says how to recover."""


# ---- revisions and schemas ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def revisions() -> tuple[str, ...]:
    """MLflow's migration revisions, oldest first (a single chain)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(""))
    return tuple(r.revision for r in reversed(list(script.walk_revisions("base", "heads"))))


def head_revision() -> str:
    return revisions()[-1]


def mlflow_tables() -> set[str]:
    """The tables MLflow's models define at the head revision (what MLflow checks before it opens a store)."""
    from mlflow.store.db.utils import Base

    return set(Base.metadata.tables)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def tables(con: sqlite3.Connection) -> list[str]:
    rows = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
    return sorted(r[0] for r in rows)


def current_revision(con: sqlite3.Connection) -> str | None:
    """The store's alembic revision (None: no ``alembic_version`` table or no row in it)."""
    if "alembic_version" not in tables(con):
        return None
    rows = [r[0] for r in con.execute("SELECT version_num FROM alembic_version")]
    if len(rows) > 1:
        raise StoreError(f"alembic_version holds {len(rows)} revisions ({', '.join(rows)})")
    return rows[0] if rows else None


def schema(con: sqlite3.Connection) -> dict:
    """The schema as SQLite states it, per table: columns (name, declared type, not null, primary-key
    position), indexes (name for a named one; columns, unique, origin) and foreign keys. ``alembic_version``
    and alembic's ``_alembic_tmp_`` tables are left out."""
    out = {}
    for t in tables(con):
        if t == "alembic_version" or t.startswith(TMP_PREFIX):
            continue
        cols = tuple((r[1], (r[2] or "").upper(), bool(r[3]), r[5]) for r in con.execute(f"PRAGMA table_info({_q(t)})"))
        idx = []
        for _, name, unique, origin, _partial in con.execute(f"PRAGMA index_list({_q(t)})"):
            icols = tuple(r[2] for r in con.execute(f"PRAGMA index_info({_q(name)})"))
            idx.append((name if origin == "c" else "", icols, bool(unique), origin))
        fks = {}
        for r in con.execute(f"PRAGMA foreign_key_list({_q(t)})"):
            fks.setdefault(r[0], [r[2], [], []])
            fks[r[0]][1].append(r[3])
            fks[r[0]][2].append(r[4])
        fk = tuple(sorted((tab, tuple(frm), tuple(to)) for tab, frm, to in fks.values()))
        out[t] = {"columns": cols, "indexes": tuple(sorted(idx)), "foreign_keys": fk}
    return out


@functools.lru_cache(maxsize=1)
def reference_schemas() -> tuple[tuple[str | None, dict], ...]:
    """(revision, schema) for the state before the first migration (None: MLflow's initial tables) and after
    every migration, built by running MLflow's own migrations on a scratch SQLite file (a few seconds)."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import InitialBase, _get_alembic_config

    out = []
    quiet = [logging.getLogger(n) for n in ("alembic", "alembic.runtime.migration", "mlflow.store.db.utils")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory(prefix="rlexp-mlflow-schema-") as d:
            path = Path(d) / "reference.db"
            url = f"sqlite:///{path}"
            engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
            InitialBase.metadata.create_all(engine)
            config = _get_alembic_config(url)

            def snapshot(rev):
                with sqlite3.connect(path) as con:
                    out.append((rev, schema(con)))

            snapshot(None)
            for rev in revisions():
                with engine.begin() as conn:
                    config.attributes["connection"] = conn
                    command.upgrade(config, rev)
                snapshot(rev)
            engine.dispose()
    finally:
        for lg, level in zip(quiet, levels, strict=True):
            lg.setLevel(level)
    return tuple(out)


# ---- what differs --------------------------------------------------------------------------------------------
def _later_objects(refs, start: int) -> tuple[set, set, set]:
    """Tables, (table, column) pairs and index names that some revision after ``refs[start]`` has."""
    tabs, cols, idx = set(), set(), set()
    for _, s in refs[start + 1 :]:
        for t, d in s.items():
            tabs.add(t)
            cols.update((t, c[0]) for c in d["columns"])
            idx.update(i[0] for i in d["indexes"] if i[0])
    return tabs, cols, idx


def rollback_plan(con: sqlite3.Connection, ref: dict, later) -> tuple[list[str], list[str], list[str]]:
    """(statements, added, blockers): the statements that take the store back to ``ref`` by removing what an
    interrupted migration added (described in ``added``, the evidence of one), and the differences that no such
    removal undoes (when there are any, no statement is returned)."""
    actual = schema(con)
    later_tables, later_cols, later_idx = later
    stmts, what, blockers = [], [], []
    present = set(tables(con))
    for t in sorted(present):
        if t.startswith(TMP_PREFIX):
            orig = t[len(TMP_PREFIX) :]
            if orig in present:
                stmts.append(f"DROP TABLE {_q(t)}")
                what.append(f"leftover {t}")
            else:
                what.append(f"{orig} dropped midway (its rows are in {t})")
                blockers.append(what[-1])
    for t in sorted(set(actual) - set(ref)):
        if t in later_tables:
            stmts.append(f"DROP TABLE {_q(t)}")
            what.append(f"table {t} created")
        else:
            blockers.append(f"unknown table {t}")
    for t in sorted(set(ref) - set(actual)):
        blockers.append(f"table {t} missing")
    drop_idx, drop_cols = [], []
    for t in sorted(set(ref) & set(actual)):
        a, r = actual[t], ref[t]
        ref_cols = {c[0]: c for c in r["columns"]}
        act_cols = {c[0]: c for c in a["columns"]}
        for name in act_cols.keys() - ref_cols.keys():
            if (t, name) in later_cols and not act_cols[name][3]:
                drop_cols.append(f"ALTER TABLE {_q(t)} DROP COLUMN {_q(name)}")
                what.append(f"column {t}.{name} added")
            else:
                blockers.append(f"unknown column {t}.{name}")
        for name in ref_cols.keys() - act_cols.keys():
            blockers.append(f"column {t}.{name} missing")
        for name in ref_cols.keys() & act_cols.keys():
            if ref_cols[name] != act_cols[name]:
                blockers.append(f"column {t}.{name} changed")
        ref_idx, act_idx = set(r["indexes"]), set(a["indexes"])
        for i in act_idx - ref_idx:
            if i[0] and i[0] in later_idx:
                drop_idx.append(f"DROP INDEX {_q(i[0])}")
                what.append(f"index {i[0]} created")
            else:
                blockers.append(f"index {i[0] or i[1]} on {t} changed")
        for i in ref_idx - act_idx:
            blockers.append(f"index {i[0] or i[1]} on {t} missing")
        if a["foreign_keys"] != r["foreign_keys"]:
            blockers.append(f"foreign keys of {t} changed")
    if blockers:
        return [], what, blockers
    return drop_idx + drop_cols + stmts, what, []


# ---- backup and repair ---------------------------------------------------------------------------------------
def backup(db: Path) -> Path:
    """A consistent copy of the store beside it, ``<db>.bak-<time>`` (SQLite's online backup)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = db.with_name(f"{db.name}.bak-{stamp}")
    n = 1
    while dest.exists():
        n += 1
        dest = db.with_name(f"{db.name}.bak-{stamp}-{n}")
    with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(dest)) as out:
        src.backup(out)
    return dest


def restore(copy: Path, db: Path) -> None:
    with closing(sqlite3.connect(copy)) as src, closing(sqlite3.connect(db)) as out:
        src.backup(out)


def upgrade(db: Path) -> None:
    """MLflow's own migration of the store to the head revision."""
    import sqlalchemy
    from mlflow.store.db.utils import _upgrade_db

    engine = sqlalchemy.create_engine(f"sqlite:///{db}", poolclass=sqlalchemy.pool.NullPool)
    try:
        _upgrade_db(engine)
    finally:
        engine.dispose()


def _runs(con: sqlite3.Connection) -> int:
    try:
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    except sqlite3.Error:
        return 0


def _uri(db: Path) -> str:
    return f"sqlite:///{db.absolute()}"


def _recovery(db: Path) -> str:
    copies = sorted(db.parent.glob(f"{db.name}.bak-*"))
    restore_hint = f"restore the copy taken before a migration (cp {copies[-1]} {db}), or " if copies else ""
    return (
        f"its runs are still in the file: keep a copy (cp {db} {db}.broken), then {restore_hint}log to a new store "
        f"(tracker.backends.mlflow.tracking_uri=sqlite:///<new>.db) and upload each run directory to it with "
        f"`rlexp replay <run_dir> --tracking-uri sqlite:///<new>.db`"
    )


def prepare_store(db: str | Path) -> str | None:
    """Check (and, where it is safe, repair and migrate) the SQLite MLflow store ``db`` before MLflow opens it.
    Returns what was done (None: nothing), raises ``StoreError`` when the store is refused. The caller holds
    the store's lock (``open_client``)."""
    db = Path(db)
    if not db.exists() or db.stat().st_size == 0:
        return None
    try:
        with closing(sqlite3.connect(db)) as con:
            present = set(tables(con))
            rev = current_revision(con)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{db}: not a usable SQLite database ({e}); point the tracking URI at an MLflow store") from e
    head = head_revision()
    ours = {t for t in present if t != "alembic_version" and not t.startswith(TMP_PREFIX)}
    if rev == head and not any(t.startswith(TMP_PREFIX) for t in present) and mlflow_tables() <= present:
        return None
    if not ours and not any(t.startswith(TMP_PREFIX) for t in present):
        if rev is not None:  # stamped, but no table was created: nothing to lose, MLflow creates the store
            with closing(sqlite3.connect(db)) as con, con:
                con.execute("DELETE FROM alembic_version")
        return None
    import mlflow

    if rev is not None and rev not in revisions():
        raise StoreError(
            f"{db}: MLflow store at schema revision {rev}, which MLflow {mlflow.__version__} does not know (a newer "
            f"MLflow wrote it); left untouched: use that MLflow version here (pip install -U mlflow) or log to "
            f"another store (tracker.backends.mlflow.tracking_uri=sqlite:///<new>.db)"
        )
    if not {"experiments", "runs"} & ours:
        raise StoreError(
            f"{db}: not an MLflow store (tables: {', '.join(sorted(ours))}); point the tracking URI at another file"
        )
    refs = reference_schemas()
    start = 0 if rev is None else revisions().index(rev) + 1
    with closing(sqlite3.connect(db)) as con:
        actual = schema(con)
        runs = _runs(con)
    has_tmp = any(t.startswith(TMP_PREFIX) for t in present)
    matches = [i for i in range(start, len(refs)) if refs[i][1] == actual and not has_tmp]
    label = rev or "none"

    def behind():
        if mlflow_tables() <= present:  # MLflow refuses such a store: its migration is the user's call
            raise StoreError(
                f"{db}: MLflow store at schema revision {label}, MLflow {mlflow.__version__} needs {head}; back it up "
                f"(cp {db} {db}.bak) then migrate it: mlflow db upgrade {_uri(db)}"
            )
        return _migrate(db, f"at revision {label}")  # as MLflow would, after a copy

    if matches and matches[0] == start:  # a store at its own revision: behind the head
        return behind()
    if matches:  # whole migrations ran, their stamp did not
        target = refs[matches[0]][0]

        def stamp(con):
            con.execute("CREATE TABLE IF NOT EXISTS alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
            con.execute("DELETE FROM alembic_version")
            con.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (target,))

        return _repair(
            db, stamp, refs[matches[0]][1], f"half-migrated (revision {label}, schema of {target}): stamped {target}"
        )
    with closing(sqlite3.connect(db)) as con:
        stmts, what, blockers = rollback_plan(con, refs[start][1], _later_objects(refs, start))
    if not what:  # nothing from a later migration, only unlike this MLflow's own build of the revision (an older
        return behind()  # MLflow created it): behind, migrated as MLflow would (a failure restores the copy)
    what = blockers + [w for w in what if w not in blockers]
    summary = "; ".join(what[:6]) + (f"; and {len(what) - 6} more" if len(what) > 6 else "")
    if not stmts:
        if runs == 0:  # nothing to lose: set it aside, MLflow creates a new store
            aside = backup(db)
            db.unlink()
            log.warning("MLflow store %s was half-migrated (%s) and held no run: moved to %s", db, summary, aside)
            return f"set aside to {aside}"
        raise StoreError(
            f"{db}: half-migrated MLflow store (revision {label}, then an interrupted migration: {summary}), not "
            f"repaired automatically; {_recovery(db)}"
        )

    def undo(con):
        for s in stmts:
            con.execute(s)

    return _repair(
        db, undo, refs[start][1], f"half-migrated (revision {label}; {summary}): interrupted migration undone"
    )


def _repair(db: Path, change, expected: dict, what: str) -> str:
    """Back up, apply ``change`` in one transaction, check the schema is ``expected``, then migrate to the
    head; any failure restores the copy and refuses the store."""
    copy = backup(db)
    with closing(sqlite3.connect(db, isolation_level=None)) as con:
        try:
            con.execute("BEGIN IMMEDIATE")
            change(con)
            if schema(con) != expected:
                raise StoreError("the repaired schema is not the revision's")
            con.execute("COMMIT")
        except (sqlite3.Error, StoreError) as e:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise StoreError(
                f"{db}: {what}: repair failed ({e}); left as it was (copy: {copy}); {_recovery(db)}"
            ) from e
    return _migrate(db, what, copy)


def _migrate(db: Path, what: str, copy: Path | None = None) -> str:
    copy = copy or backup(db)
    try:
        upgrade(db)
    except Exception as e:
        restore(copy, db)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StoreError(
            f"{db}: {what}, then its migration to {head_revision()} failed ({first}); restored from {copy}; "
            f"{_recovery(db)}"
        ) from e
    log.warning("MLflow store %s: %s, migrated to %s (a copy from before: %s)", db, what, head_revision(), copy)
    return f"{what}; copy: {copy}"
