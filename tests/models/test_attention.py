import copy

import pytest
import torch

from rlexp.core.forward import token_logprobs
from rlexp.models.attention import NAME, sdpa_or_matmul, use_cpu_matmul_grad_attention
from rlexp.rollout.hf import HFRollout
from tests.conftest import chat_prompts


@pytest.fixture(scope="module")
def tiny_batch(tiny):
    torch.manual_seed(0)
    return tiny, HFRollout(max_new_tokens=9).generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 3)


def _logprobs_and_grads(model, out, share):
    model.zero_grad()
    lp, _ = token_logprobs(
        model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 0.9, share_prompts=share
    )
    (lp * out.completion_mask).sum().backward()
    return lp * out.completion_mask, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("share", [True, False])
def test_matmul_attention_equals_sdpa_in_values_and_gradients(tiny_batch, share):
    """Left-padded prompts, with the shared-prompt KV path (2D mask over a cache) and the full forward
    (our 4D boolean mask): the matmul path gives SDPA's log-probs and gradients."""
    lm, out = tiny_batch
    matmul = copy.deepcopy(lm.model)
    assert use_cpu_matmul_grad_attention(matmul) and matmul.config._attn_implementation == NAME
    lp_ref, g_ref = _logprobs_and_grads(lm.model, out, share)
    lp, g = _logprobs_and_grads(matmul, out, share)
    assert torch.allclose(lp, lp_ref, atol=1e-5)
    assert float((g - g_ref).norm() / g_ref.norm()) < 1e-5


def test_causal_mask_when_transformers_passes_none():
    """No mask (transformers' causal skip): queries are the last positions, lower-right aligned."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    module = torch.nn.Module()
    module.is_causal = True
    with torch.enable_grad():
        out, _ = sdpa_or_matmul(module, q.requires_grad_(), k, v, None)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    mask = torch.ones(3, 5, dtype=torch.bool).tril(2)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, attn_mask=mask).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5)


def test_generation_keeps_sdpa(tiny_batch):
    """Without gradients (decoding) the registered function is SDPA itself: greedy tokens unchanged."""
    lm, _ = tiny_batch
    matmul = copy.deepcopy(lm.model)
    use_cpu_matmul_grad_attention(matmul)
    tok = lm.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
        )
    ]
    a = HFRollout(max_new_tokens=6).generate(lm.model, tok, prompts, 1, greedy=True)
    b = HFRollout(max_new_tokens=6).generate(matmul, tok, prompts, 1, greedy=True)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.allclose(a.logprobs, b.logprobs)
