"""Checkpoints: model, optimiser, scheduler, step, RNG states, data position, reference (EMA) and
tracker run ids — everything a killed run needs to continue. Written to a temporary directory and
renamed into place, so a kill during a save leaves the previous checkpoint intact.

Retention: the newest checkpoint is ``checkpoints/last``; with ``keep > 1`` the ones before it stay as
``checkpoints/step-<N>`` (the oldest go first). ``optimizer_state=False`` leaves AdamW's moments out (about
two thirds of a full checkpoint): such a checkpoint still resumes, with fresh optimiser moments."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import torch

LAST = "last"
STEP_PREFIX = "step-"

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
    meta = Path(path) / "trainer.json"
    return json.loads(meta.read_text())["step"] if meta.exists() else None


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
) -> Path:
    """Write the checkpoint of ``step`` as ``root/last``; keep the ``keep`` newest in all (at least this one)."""
    root = Path(root)
    tmp = root / f".tmp-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model")
    torch.save(
        {
            "optimizer": optimizer.state_dict() if optimizer_state else None,
            "scheduler": scheduler.state_dict() if scheduler else None,
            "rng": rng_state(),
            "reference": reference.state_dict() if reference else None,
            "critic": critic.state_dict() if critic is not None else None,
        },
        tmp / "state.pt",
    )
    (tmp / "trainer.json").write_text(
        json.dumps({"step": step, "sampler": sampler.state_dict(), "tracker_ids": tracker_ids, **(extra or {})})
    )
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
    root = Path(root)
    for name in (LAST, ".old"):  # .old survives a kill between the two renames
        p = root / name
        if (p / "trainer.json").exists():
            return p
    return None


def load_checkpoint(path: Path, *, model, optimizer, scheduler, sampler, reference, critic=None) -> dict:
    from safetensors.torch import load_file

    path = Path(path)
    files = sorted((path / "model").glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(str(f), device=str(next(model.parameters()).device)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}")
    blob = torch.load(path / "state.pt", weights_only=False)
    if blob["optimizer"] is not None:
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
    meta = json.loads((path / "trainer.json").read_text())
    sampler.load_state_dict(meta["sampler"])
    set_rng_state(blob["rng"])
    return meta
