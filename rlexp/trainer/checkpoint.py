"""Checkpoints: model, optimiser, scheduler, step, RNG states, data position, reference (EMA) and
tracker run ids — everything a killed run needs to continue. Written to a temporary directory and
renamed into place, so a kill during a save leaves the previous checkpoint intact."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch

LAST = "last"


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
) -> Path:
    root = Path(root)
    tmp = root / f".tmp-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model")
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
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
        shutil.rmtree(old)
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
    optimizer.load_state_dict(blob["optimizer"])
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
