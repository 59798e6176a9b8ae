"""Checkpoints are verified on write (manifest.json: size and sha256 of every file, after checking the
safetensors header and the CRCs of state.pt), a resume falls back to the previous checkpoint when the newest
fails, a failed resume leaves the run directory's files as they were, and a full disk is said as such."""

import errno
import json

import pytest
import torch

from rlexp.runs.training import run
from rlexp.trainer import checkpoint as ckpt
from rlexp.trainer.checkpoint import CheckpointError, restore_checkpoint, save_checkpoint, verify


class CrashAt:
    def __init__(self, step):
        self.step = step

    def on_step_end(self, step, metrics, eval_metrics):
        if step == self.step:
            raise RuntimeError("simulated crash")
        return False


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _truncate(path, keep_bytes=100):
    data = path.read_bytes()
    path.write_bytes(data[:keep_bytes])


class _Sampler:
    def __init__(self):
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def _save(root, step, model, opt, keep=2):
    return save_checkpoint(
        root,
        step=step,
        model=model,
        optimizer=opt,
        scheduler=None,
        sampler=_Sampler(),
        reference=None,
        tracker_ids=None,
        keep=keep,
    )


@pytest.fixture
def small(tiny):
    model = tiny.model
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_a_checkpoint_carries_a_manifest_that_detects_truncation_and_changes(tmp_path, small):
    model, opt = small
    path = _save(tmp_path, 1, model, opt)
    manifest = json.loads((path / "manifest.json").read_text())["files"]
    assert set(manifest) >= {"model/model.safetensors", "state.pt", "trainer.json", "model/config.json"}
    verify(path)  # as written

    weights = path / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte of a tensor altered, same size
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors: contents changed since written"):
        verify(path)
    _truncate(weights, len(data) - 10)
    with pytest.raises(CheckpointError, match=r"model.safetensors: \d+ bytes, \d+ written"):
        verify(path)


def test_files_are_checked_whole_without_a_manifest(tmp_path, small):
    """A checkpoint from before manifests (or one whose manifest is gone) is still checked file by file."""
    model, opt = small
    path = _save(tmp_path, 1, model, opt)
    (path / "manifest.json").unlink()
    verify(path)
    _truncate(path / "state.pt", (path / "state.pt").stat().st_size - 50)
    with pytest.raises(CheckpointError, match="state.pt"):
        verify(path)
    weights = path / "model" / "model.safetensors"
    size = weights.stat().st_size
    _truncate(weights, size - 100)
    with pytest.raises(ValueError, match=rf"{size - 100} bytes where the header says {size}"):
        ckpt.check_file(weights)
    _truncate(weights, 100)
    with pytest.raises(ValueError, match="truncated inside its header"):
        ckpt.check_file(weights)


def test_restore_falls_back_to_the_previous_checkpoint(tmp_path, small, caplog):
    model, opt = small
    _save(tmp_path, 1, model, opt)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    _save(tmp_path, 2, model, opt)
    _truncate(tmp_path / "last" / "model" / "model.safetensors")
    path, meta = restore_checkpoint(
        tmp_path, model=model, optimizer=opt, scheduler=None, sampler=_Sampler(), reference=None
    )
    assert path.name == "step-000001" and meta["step"] == 1
    assert "checkpoint" in caplog.text and "trying the one before it" in caplog.text


def test_no_usable_checkpoint_is_one_line_naming_each(tmp_path, small):
    model, opt = small
    _save(tmp_path, 1, model, opt)
    _save(tmp_path, 2, model, opt)
    _truncate(tmp_path / "last" / "state.pt")
    _truncate(tmp_path / "step-000001" / "model" / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        restore_checkpoint(tmp_path, model=model, optimizer=opt, scheduler=None, sampler=_Sampler(), reference=None)
    msg = str(e.value)
    assert "\n" not in msg and f"no usable checkpoint in {tmp_path}" in msg
    assert "last (" in msg and "step-000001 (" in msg and "hydra.run.dir" in msg


def test_no_space_left_removes_the_temporary_checkpoint_and_keeps_the_previous(tmp_path, small, monkeypatch):
    model, opt = small
    _save(tmp_path, 1, model, opt)
    real_save = torch.save

    def full_disk(obj, f, *a, **k):  # the disk fills up halfway through state.pt
        real_save(obj, f, *a, **k)
        _truncate(f, 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    with pytest.raises(CheckpointError, match="checkpoint of step 2: no space left on device") as e:
        _save(tmp_path, 2, model, opt)
    assert "\n" not in str(e.value) and "previous one is intact" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]  # no .tmp-2 left behind
    verify(tmp_path / "last")
    assert ckpt.checkpoint_step(tmp_path / "last") == 1


def test_a_run_resumes_from_the_previous_checkpoint_when_the_last_is_truncated(tiny_cfg, tmp_path):
    common = ["trainer.max_steps=4", "trainer.checkpoint_every=1"]
    cfg = tiny_cfg(*common)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(cfg, callbacks=[CrashAt(3)])  # steps 1-3 logged; checkpoints of steps 2 (last) and 1 (the fallback)
    assert [ckpt.checkpoint_step(p) for p in ckpt.kept_checkpoints(run_dir / "checkpoints")] == [2, 1]
    _truncate(run_dir / "checkpoints" / "last" / "model" / "model.safetensors")

    result = run(cfg)  # falls back to step 1, recomputes 2-3 (logged already), logs 4
    assert result.last_step == 4
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the fallback is dropped once the run finishes (trainer.keep_checkpoints=1)
    assert [ckpt.checkpoint_step(p) for p in ckpt.kept_checkpoints(run_dir / "checkpoints")] == [4]

    from tests.conftest import TINY, compose_train

    ref_dir = tmp_path / "ref"
    run(compose_train([*TINY, *common], ref_dir))
    for a, b in zip(rows, _rows(ref_dir)):  # the recomputed trajectory is the uninterrupted one
        assert a["loss/total"] == pytest.approx(b["loss/total"], abs=1e-5)


def test_a_failed_resume_leaves_the_run_files_as_they_were(tiny_cfg, tmp_path):
    cfg = tiny_cfg("trainer.max_steps=3", "trainer.checkpoint_every=1")
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(cfg, callbacks=[CrashAt(3)])
    for p in ckpt.kept_checkpoints(run_dir / "checkpoints"):
        _truncate(p / "state.pt")
    files = ("provenance.json", "config.yaml", "overrides.yaml", "run.json", "metrics.jsonl")
    before = {f: (run_dir / f).read_bytes() for f in files}
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        run(tiny_cfg("trainer.max_steps=4", "trainer.checkpoint_every=1"))
    assert {f: (run_dir / f).read_bytes() for f in files} == before
