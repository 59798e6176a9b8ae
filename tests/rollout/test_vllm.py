"""rollout=vllm (rlexp/rollout/vllm.py). vLLM cannot be installed on the project's machines: here the
config composes, the backend constructs without vllm, and using it says what is missing. The GPU test
(skipped without vllm and CUDA) checks the recorded log-probs against the training forward after a
weight push."""

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from rlexp.core.forward import token_logprobs
from rlexp.rollout.vllm import VLLMRollout
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
