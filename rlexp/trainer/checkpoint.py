"""Checkpoints: model, optimiser, scheduler, step, RNG states, data position, reference (EMA) and
tracker run ids — everything a killed run needs to continue. Written to a temporary directory and
renamed into place, so a kill during a save leaves the previous checkpoint intact.

Verified on write: every file is read back and checked (the safetensors header against the file's length,
the CRC of every member of ``state.pt``) and its size and sha256 go into ``manifest.json``; a resume checks
them again and falls back to the next older checkpoint when one does not hold (``restore_checkpoint``).

Retention: the newest checkpoint is ``checkpoints/last``; with ``keep > 1`` the ones before it stay as
``checkpoints/step-<N>`` (the oldest go first). ``optimizer_state=False`` leaves AdamW's moments out (about
two thirds of a full checkpoint): such a checkpoint still resumes, with fresh optimiser moments.

A save that fails (no space left on device, …) removes its temporary directory and leaves the previous
checkpoints as they were."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import random
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import torch

LAST = "last"
STEP_PREFIX = "step-"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the one-line message names the path and what to do."""


log = logging.getLogger(__name__)


def dir_size(path: Path) -> int:
    """Bytes under ``path`` (0 when it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def checkpoint_step(path: Path) -> int | None:
    """The step of the checkpoint at ``path``; None when its ``trainer.json`` is missing or unreadable."""
    try:
        return int(json.loads((Path(path) / "trainer.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kept_checkpoints(root: Path) -> list[Path]:
    """Every complete checkpoint under ``root``, newest first (``last``, then ``step-<N>`` by step)."""
    root = Path(root)
    older = sorted(root.glob(f"{STEP_PREFIX}*"), key=lambda p: checkpoint_step(p) or -1, reverse=True)
    return [p for p in [root / LAST, *older] if (p / "trainer.json").exists()]


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    *,
    step: int,
    model,
    optimizer,
    scheduler,
    sampler,
    reference,
    tracker_ids,
    extra: dict | None = None,
    critic=None,
    keep: int = 1,
    optimizer_state: bool = True,
    rollout=None,
    pending=None,
    stages=(),
    model_state: dict | None = None,
    optimizer_state_dict: dict | None = None,
) -> Path:
    """Write the checkpoint of ``step`` as ``root/last``; keep the ``keep`` newest in all (at least this one).
    ``pending``: the trainer's ``AsyncRollout`` (trainer.async_rollout), whose rollout generated ahead for the next
    step is kept (waited for first). ``model_state`` / ``optimizer_state_dict``: the full states gathered from a
    sharded model (distributed=fsdp: ``rlexp.trainer.sharding``; deepspeed_zero*: ``rlexp.trainer.zero``), written
    instead of the model's and optimiser's."""
    root = Path(root)
    tmp = root / f".tmp-{step}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp / "model", **({} if model_state is None else {"state_dict": model_state}))
        if optimizer_state and optimizer_state_dict is None:
            optimizer_state_dict = optimizer.state_dict()
        torch.save(
            {
                "optimizer": optimizer_state_dict if optimizer_state else None,
                "scheduler": scheduler.state_dict() if scheduler else None,
                "rng": rng_state(),
                "reference": reference.state_dict() if reference else None,
                "critic": critic.state_dict() if critic is not None else None,
                # the rollout engine's own state (SPEC-RL's cache of earlier completions), if it keeps one
                "rollout": rollout.state_dict() if hasattr(rollout, "state_dict") else None,
                "async_rollout": pending.state_dict() if pending is not None else None,
                # group stages that keep state across steps (RePO's replay buffer), by position
                "group_stages": [st.state_dict() if hasattr(st, "state_dict") else None for st in stages],
            },
            tmp / "state.pt",
        )
        (tmp / "trainer.json").write_text(
            json.dumps({"step": step, "sampler": sampler.state_dict(), "tracker_ids": tracker_ids, **(extra or {})})
        )
        write_manifest(tmp)
    except BaseException as e:  # a failed or interrupted save leaves no temporary directory behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            size = max((dir_size(p) for p in kept_checkpoints(root)), default=0)
            need = f" (a checkpoint here takes {human_size(size)})" if size else ""
            raise CheckpointError(
                f"checkpoint of step {step}: no space left on device in {root}{need}; the temporary checkpoint was "
                "removed and the previous one is intact: free space (or set trainer.save_optimizer=false) and rerun "
                "in the same directory to resume"
            ) from e
        raise
    final = root / LAST
    old = root / ".old"
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        previous = checkpoint_step(old)
        if keep > 1 and previous is not None and previous != step:
            old.rename(root / f"{STEP_PREFIX}{previous:06d}")
        else:
            shutil.rmtree(old)
    for stale in kept_checkpoints(root)[max(keep, 1) :]:
        shutil.rmtree(stale)
    return final


def find_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (``last``, or ``.old`` when a kill fell between the two renames of a
    save, or the newest ``step-<N>``); None when there is none."""
    found = candidates(root)
    return found[0] if found else None


def candidates(root: Path) -> list[Path]:
    """Every complete checkpoint under ``root`` in the order a resume tries them: newest first."""
    root = Path(root)
    paths = [root / LAST, root / ".old"] + sorted(
        root.glob(f"{STEP_PREFIX}*"), key=lambda p: checkpoint_step(p) or -1, reverse=True
    )
    return [p for p in paths if (p / "trainer.json").exists()]


# ---- verification -------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def check_file(path: Path) -> None:
    """Raise ``ValueError`` when a checkpoint file is not whole: a safetensors file shorter or longer than its
    header says, a zip (``torch.save``) member whose CRC fails."""
    if path.suffix == ".safetensors":
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("truncated (no header)")
            (n,) = struct.unpack("<Q", head)
            raw = f.read(n)
        if len(raw) < n:
            raise ValueError("truncated inside its header")
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a safetensors header")
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if path.stat().st_size != 8 + n + end:
            raise ValueError(f"{path.stat().st_size} bytes where the header says {8 + n + end}")
    elif path.suffix in (".pt", ".bin"):  # torch.save writes a zip archive (since torch 1.6)
        if not zipfile.is_zipfile(path):
            raise ValueError("not a whole torch.save archive (its zip directory is missing)")
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            raise ValueError(f"member {bad} fails its CRC")


def write_manifest(path: Path) -> None:
    """Check every file of the checkpoint at ``path`` as written and record its size and sha256."""
    files = {}
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file() and p.name != MANIFEST):
        try:
            check_file(f)
        except (ValueError, zipfile.BadZipFile, json.JSONDecodeError) as e:
            raise CheckpointError(f"checkpoint {path}: {f.relative_to(path)} was not written whole ({e})") from e
        files[str(f.relative_to(path))] = {"bytes": f.stat().st_size, "sha256": _sha256(f)}
    (Path(path) / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def verify(path: Path) -> None:
    """Raise ``CheckpointError`` naming the first file of the checkpoint at ``path`` that is missing, of another
    size or another sha256 than its manifest records. A checkpoint written before manifests: checked whole."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.exists():
        for f in path.rglob("*"):
            if f.is_file():
                try:
                    check_file(f)
                except (ValueError, zipfile.BadZipFile, json.JSONDecodeError) as e:
                    raise CheckpointError(f"{f}: {e}") from e
        return
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{manifest}: unreadable ({e})") from e
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        if f.stat().st_size != want["bytes"]:
            raise CheckpointError(f"{f}: {f.stat().st_size} bytes, {want['bytes']} written")
        if _sha256(f) != want["sha256"]:
            raise CheckpointError(f"{f}: contents changed since written (sha256)")


def restore_checkpoint(root: Path, **parts) -> tuple[Path, dict] | None:
    """Load the newest checkpoint under ``root`` that verifies and loads (see ``load_checkpoint`` for
    ``parts``), falling back to older ones with a warning; None when ``root`` holds none. Raises
    ``CheckpointError`` naming every checkpoint tried when none can be used."""
    tried = []
    for path in candidates(root):
        try:
            verify(path)
            return path, load_checkpoint(path, **parts)
        except Exception as e:  # a corrupt file fails in safetensors, torch.load, json or load_state_dict
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            tried.append(f"{path.name} ({reason})")
            log.warning("checkpoint %s cannot be used (%s); trying the one before it", path, reason)
    if not tried:
        return None
    raise CheckpointError(
        f"no usable checkpoint in {root}: {'; '.join(tried)}. Restore the run directory from a copy, or train in a "
        "new one (hydra.run.dir=<dir>); the steps logged here stay as they are"
    )


def prune(root: Path, keep: int) -> None:
    """Keep the ``keep`` newest checkpoints under ``root`` (0: remove the folder)."""
    root = Path(root)
    if keep <= 0:
        shutil.rmtree(root, ignore_errors=True)
        return
    for stale in kept_checkpoints(root)[keep:]:
        shutil.rmtree(stale)


def load_checkpoint(
    path: Path,
    *,
    model,
    optimizer,
    scheduler,
    sampler,
    reference,
    critic=None,
    rollout=None,
    pending=None,
    stages=(),
    states=None,
) -> dict:
    """Load the checkpoint at ``path`` into the parts given. ``states``: the sharding's full-state loaders when the
    model is sharded (``Distributed.states``: FSDP's or the ZeRO engine's; every process loads the full weights and
    optimiser state into its shards). An optimiser state saved by a sharded run (keyed by parameter name) loads into a
    plain one and the other way round."""
    from safetensors.torch import load_file

    from rlexp.trainer import sharding

    path = Path(path)
    files = sorted((path / "model").glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(str(f), device=str(next(model.parameters()).device)))
    if (path / "model" / "adapter_config.json").exists():  # model/peft=lora: the adapters only
        from rlexp.models.peft import load_adapters

        if states is not None:  # sharded (FSDP, DeepSpeed): into the shards or partitions the optimiser steps
            states.load_adapters(model, state, path)
        else:
            load_adapters(model, state, path)
    else:
        if states is not None:
            missing, unexpected = states.load_model_state(model, state)
        else:
            missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise RuntimeError(f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}")
    blob = torch.load(path / "state.pt", weights_only=False)
    if blob["optimizer"] is not None and (states is not None or sharding.keyed_by_name(blob["optimizer"])):
        (states or sharding).load_optimizer_state(model, optimizer, blob["optimizer"])
    elif blob["optimizer"] is not None:
        optimizer.load_state_dict(blob["optimizer"])
    else:
        log.warning(
            "checkpoint %s has no optimiser state (trainer.save_optimizer=false): fresh optimiser moments", path
        )
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    if reference is not None:
        reference.load_state_dict(blob["reference"])
    if critic is not None:
        critic.load_state_dict(blob.get("critic"), model)
    if hasattr(rollout, "load_state_dict"):
        if blob.get("rollout") is None and getattr(rollout, "cache", None) is not None:
            log.warning("checkpoint %s holds no rollout cache: speculative reuse starts from an empty one", path)
        rollout.load_state_dict(blob.get("rollout"))
    ahead = blob.get("async_rollout")
    if pending is not None:
        pending.load_state_dict(ahead, next(model.parameters()).device)
    elif ahead:
        log.warning(
            "checkpoint %s holds the rollout of step %d generated ahead (trainer.async_rollout=true); this run "
            "generates synchronously, so it is dropped and its prompts are not trained on",
            path,
            ahead["step"],
        )
    saved = blob.get("group_stages") or []
    for i, stage in enumerate(stages):
        if hasattr(stage, "load_state_dict"):
            if i >= len(saved) or saved[i] is None:
                log.warning("checkpoint %s holds no state for group stage %d: it starts empty", path, i)
            stage.load_state_dict(saved[i] if i < len(saved) else None)
    meta = json.loads((path / "trainer.json").read_text())
    sampler.load_state_dict(meta["sampler"])
    set_rng_state(blob["rng"])
    return meta
