import json
from pathlib import Path

import pytest

from rlexp.runs.training import run
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
    compiled = _steps(
        compose_train([*TINY, "trainer.compile=true", f"trainer.compile_backend={backend}"], tmp_path / "compiled")
    )
    for a, b in zip(plain, compiled, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        for k in ("loss/total", "grad_norm", "entropy/mean"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


def test_token_budget_micro_batches_give_the_same_steps(tiny_cfg, tmp_path):
    """trainer.micro_batch_tokens cuts the update into micro-batches by padded positions (here many
    small ones): the whole-batch normalisers give the same losses and gradient norms."""
    plain = _steps(tiny_cfg("trainer.share_prompt_forward=false"))
    budget = _steps(
        compose_train(
            [*TINY, "trainer.share_prompt_forward=false", "trainer.micro_batch_tokens=48"], tmp_path / "budget"
        )
    )
    for a, b in zip(plain, budget, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        for k in ("loss/total", "grad_norm", "entropy/mean"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


@pytest.mark.gpu
@pytest.mark.parametrize("graph", ["compile", "capture", "capture_compiled"])
def test_two_cuda_steps_with_each_decode_graph_and_compiled_training(tiny_cfg, graph):
    """On CUDA (pytest -m gpu on the device machine): two training steps with the static-cache rollout
    under each decode graph and the compiled training forward; finite losses and gradient norms."""
    import math

    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rows = _steps(
        tiny_cfg("trainer.device=cuda", "rollout=hf_static", f"rollout.decode_graph={graph}", "trainer.compile=true")
    )
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss/total"]) and math.isfinite(r["grad_norm"]) for r in rows)
