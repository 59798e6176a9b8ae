import json
from pathlib import Path

import pytest

from rlexp.train import run
from tests.conftest import TINY, compose_train


def test_two_step_train_on_tiny_writes_metrics(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    result = run(cfg)
    assert result.last_step == 2
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "accuracy", "entropy/mean", "length/mean", "time/generate_s", "grad_norm", "loss/total"):
        assert key in rows[0], key


def _steps(cfg):
    run(cfg)
    return [json.loads(l) for l in (Path(cfg.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_training_forward_gives_the_same_steps(tiny_cfg, tmp_path, backend):
    """trainer.compile: the training forward traced by dynamo (``eager`` backend: the tracing path,
    fast) or compiled by Inductor (slow: ~45 s of compilation on 2 cores) gives the uncompiled run's
    losses and gradient norms, step for step (same seed, same rollouts)."""
    plain = _steps(tiny_cfg("trainer.share_prompt_forward=false"))
    compiled = _steps(compose_train([*TINY, "trainer.compile=true", f"trainer.compile_backend={backend}"],
                                    tmp_path / "compiled"))
    for a, b in zip(plain, compiled, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        for k in ("loss/total", "grad_norm", "entropy/mean"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
