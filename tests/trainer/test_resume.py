"""A run interrupted after a checkpoint resumes into the same tracker run: every step logged exactly
once, and the resumed trajectory equals an uninterrupted one (RNG, data position, optimiser restored)."""

import json

import pytest
from mlflow import MlflowClient

from rlexp.runs.training import run


class CrashAt:
    def __init__(self, step):
        self.step = step

    def on_step_end(self, step, metrics, eval_metrics):
        if step == self.step:
            raise RuntimeError("simulated crash")
        return False


def _steps(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_resume_after_crash_logs_each_step_once_and_matches_uninterrupted(tiny_cfg, tmp_path):
    db = f"sqlite:///{tmp_path}/mlruns.db"
    common = [
        "trainer.max_steps=3",
        "trainer.checkpoint_every=1",
        "tracker=mlflow",
        f"tracker.backends.mlflow.tracking_uri={db}",
        f"tracker.backends.mlflow.artifact_location={tmp_path}/art",
    ]
    cfg = tiny_cfg(*common)
    run_dir = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(cfg, callbacks=[CrashAt(2)])  # step 2 is logged, its checkpoint is not written
    assert [r["step"] for r in _steps(run_dir)] == [1, 2]
    result = run(cfg)
    assert result.last_step == 3
    rows = _steps(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]

    client = MlflowClient(db)
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    assert len(runs) == 1, "the resumed run must continue the same MLflow run"
    history = client.get_metric_history(runs[0].info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert runs[0].info.status == "FINISHED"

    ref_dir = tmp_path / "ref"
    from tests.conftest import TINY, compose_train

    ref = compose_train([*TINY, *common], ref_dir)
    run(ref)
    ref_rows = _steps(ref_dir)
    for a, b in zip(rows, ref_rows):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["loss/total"] == pytest.approx(b["loss/total"], abs=1e-5)
        assert a["length/mean"] == b["length/mean"]


def test_ppo_checkpoint_holds_the_critic_and_resume_restores_it(tiny_cfg, tmp_path):
    import torch

    cfg = tiny_cfg("algorithm=ppo", "trainer.checkpoint_every=1")
    run(cfg)
    blob = torch.load(tmp_path / "run" / "checkpoints" / "last" / "state.pt", weights_only=False)
    saved = blob["critic"]
    assert saved is not None and "model" in saved and "optimizer" in saved
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.trainer.max_steps = 3
    result = run(cfg)  # resumes at step 2 with the saved critic (a rebuilt one would start from a zero head)
    assert result.last_step == 3


@pytest.mark.long
def test_sfpo_switch_off_survives_a_resume(tiny_cfg, tmp_path):
    """SFPO's entropy z-score switch-off is rebuilt from the metrics log on resume: with a window of 2 and a
    threshold every z-score reaches, it switches off after step 2, and a run resumed at step 2 keeps it off."""
    from omegaconf import open_dict

    cfg = tiny_cfg(
        "algorithm=sfpo",
        "algorithm.slow_fast.fast_steps=1",
        "algorithm.slow_fast.stop_window=2",
        "algorithm.slow_fast.stop_threshold=-1e9",
        "trainer.steps_per_rollout=1",
        "trainer.max_steps=2",
        "trainer.checkpoint_every=1",
        "trainer.max_new_tokens=6",
    )
    run(cfg)
    assert [r["sfpo/active"] for r in _steps(tmp_path / "run")] == [1.0, 1.0]
    with open_dict(cfg):
        cfg.trainer.max_steps = 3
    run(cfg)
    rows = _steps(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["sfpo/active"] == 0.0 and rows[-1]["train/optimizer_steps"] == 1.0
