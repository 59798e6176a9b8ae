"""Checkpoint retention: ``trainer.keep_checkpoints`` (the newest N; 0: none once the run finishes) and
``trainer.save_optimizer`` (weights-only checkpoints still resume)."""

import json

import pytest
import torch

from rlexp.runs.training import run
from rlexp.trainer.checkpoint import dir_size, human_size, kept_checkpoints, save_checkpoint


class _Sampler:
    def state_dict(self):
        return {}


def _save(root, step, keep, model, opt, optimizer_state=True):
    class M:
        def save_pretrained(self, d):
            d.mkdir(parents=True)
            torch.save(model.state_dict(), d / "weights.pt")

    return save_checkpoint(
        root,
        step=step,
        model=M(),
        optimizer=opt,
        scheduler=None,
        sampler=_Sampler(),
        reference=None,
        tracker_ids=None,
        keep=keep,
        optimizer_state=optimizer_state,
    )


def _steps(root):
    return [json.loads((p / "trainer.json").read_text())["step"] for p in kept_checkpoints(root)]


@pytest.mark.parametrize(("keep", "kept"), [(1, [5]), (2, [5, 4]), (3, [5, 4, 3])])
def test_the_newest_checkpoints_are_kept(tmp_path, keep, kept):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    for step in range(1, 6):
        _save(tmp_path, step, keep, model, opt)
    assert _steps(tmp_path) == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["last", *[f"step-{s:06d}" for s in kept[1:]]]
    )  # no temporary or .old folder left behind


def test_sizes_read_as_a_person_would():
    assert human_size(999) == "999 B" and human_size(1_600_000_000) == "1.60 GB"


def test_save_optimizer_false_leaves_adam_moments_out(tmp_path):
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    full = _save(tmp_path / "full", 1, 1, model, opt)
    light = _save(tmp_path / "light", 1, 1, model, opt, optimizer_state=False)
    assert torch.load(light / "state.pt", weights_only=False)["optimizer"] is None
    assert dir_size(light) < dir_size(full) - 2 * 64 * 64 * 4  # two fp32 moments of the weight matrix


def test_keep_zero_deletes_the_checkpoint_when_the_run_finishes(tiny_cfg, tmp_path):
    run(tiny_cfg("trainer.keep_checkpoints=0", "trainer.checkpoint_every=1"))
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_weights_only_checkpoint_resumes(tiny_cfg, tmp_path):
    cfg = tiny_cfg("trainer.save_optimizer=false", "trainer.keep_checkpoints=2", "trainer.checkpoint_every=1")
    run(cfg)
    assert _steps(tmp_path / "run" / "checkpoints") == [2, 1]
    cfg.trainer.max_steps = 3
    result = run(cfg)  # resumes from step 2 with fresh optimiser moments
    assert result.last_step == 3
    assert [json.loads(l)["step"] for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
