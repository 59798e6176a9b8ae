"""A run's identity, kept in ``<run dir>/run.json``: a unique id and the absolute path the run was created at.
It decides which tracker run (MLflow, W&B) a start continues, so that steps land in the run they belong to:

- a fresh directory: a new run;
- ``trainer.resume=false`` in a directory that holds a run (logged steps or a checkpoint): refused, since the
  new steps would be spliced into the old run's logs;
- resumed where it was created: the same run, its tracker runs continue;
- resumed from another path while the directory it was created at still holds the same run: a **copy**. It
  becomes a run of its own (new id, ``forked_from`` the original's): new tracker runs that receive the copied
  history, so the original's dashboard run gets nothing of the copy's;
- resumed from another path where the original is gone: **moved**, the same run (its path updated).

A directory written before run.json existed is adopted as created where it is."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from rlexp.config.schema import ConfigError
from rlexp.tracking.base import read_jsonl
from rlexp.tracking.provenance import now_iso
from rlexp.trainer.checkpoint import candidates

FILE = "run.json"


@dataclass
class RunIdentity:
    uid: str
    path: str  # absolute path of the run directory
    created: str
    forked_from: str | None = None  # uid of the run this directory was copied from
    moved_from: str | None = None  # the path this run was created at, when it was moved since
    # whether the trackers continue the runs saved in the directory (a resume) or open new ones (a fresh run,
    # a copy); not saved
    continues: bool = False

    def save(self, run_dir: Path) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "continues" and v is not None}
        (Path(run_dir) / FILE).write_text(json.dumps(data, indent=2))

    def tags(self) -> dict[str, str]:
        tags = {"run_uid": self.uid}
        if self.forked_from:
            tags["forked_from"] = self.forked_from
        return tags


def read_identity(run_dir: Path) -> RunIdentity | None:
    p = Path(run_dir) / FILE
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
        return RunIdentity(**{k: data.get(k) for k in ("uid", "path", "created", "forked_from", "moved_from")})
    except (json.JSONDecodeError, TypeError) as e:
        raise ConfigError(f"{p}: unreadable run identity ({e}); restore it from a copy or use a new run directory")


def holds_run(run_dir: Path) -> bool:
    """A run has left its work here: logged steps or a checkpoint."""
    run_dir = Path(run_dir)
    return bool(read_jsonl(run_dir / "metrics.jsonl")) or bool(candidates(run_dir / "checkpoints"))


def claim_identity(run_dir: Path, resume: bool) -> RunIdentity:
    """The identity of the run about to start in ``run_dir`` (see the module docstring). Nothing is written:
    the caller saves it once the start has succeeded (a failed resume leaves the directory as it was)."""
    run_dir = Path(run_dir).resolve()
    here = str(run_dir)
    saved = read_identity(run_dir)
    if not holds_run(run_dir):
        return RunIdentity(uid=uuid.uuid4().hex, path=here, created=now_iso())
    if not resume:
        raise ConfigError(
            f"trainer.resume=false: {run_dir} already holds a run (logged steps or a checkpoint); its steps would "
            "be mixed with the new run's. Start in a new directory (hydra.run.dir=<dir>), or resume it "
            "(trainer.resume=true)"
        )
    if saved is None:  # written before run identities: adopt it where it is
        return RunIdentity(uid=uuid.uuid4().hex, path=here, created=now_iso(), continues=True)
    if saved.path == here:
        saved.continues = True
        return saved
    original = Path(saved.path)
    other = read_identity(original) if original.is_dir() else None
    if other is not None and other.uid == saved.uid:  # the original still holds this run: we are a copy
        return RunIdentity(uid=uuid.uuid4().hex, path=here, created=now_iso(), forked_from=saved.uid)
    return RunIdentity(
        uid=saved.uid,
        path=here,
        created=saved.created,
        forked_from=saved.forked_from,
        moved_from=saved.path,
        continues=True,
    )
