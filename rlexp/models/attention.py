"""Attention for training on the CPU.

``sdpa_or_matmul`` is registered with transformers' ``AttentionInterface`` as ``"sdpa_cpu_matmul_grad"``:
it is SDPA everywhere except where a gradient will be taken on the CPU, where it computes attention
with explicit matmuls and a softmax. PyTorch's CPU flash-attention backward is slow: SmolLM2-135M, 16
completions of 64 tokens on 53-token prompts, one thread — forward + backward 5.3 s with SDPA, 4.5 s
with matmul attention; decoding, which takes no gradient, keeps SDPA (with matmul attention it was
~20 % slower). Masks are SDPA's (boolean, True = attend, or None for plain causal).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_cpu_matmul_grad"


def sdpa_or_matmul(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
):
    if not (torch.is_grad_enabled() and query.device.type == "cpu") or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    B, H, q_len, D = query.shape
    KV, k_len = key.shape[1], key.shape[2]
    rep = H // KV
    # GQA without repeat_kv: the rep query heads of a KV head are stacked along the query axis, so
    # each KV head is multiplied once and never copied (14 vs 16.5 ms per SmolLM2 layer, fwd + bwd)
    scores = torch.matmul(query.reshape(B, KV, rep * q_len, D), key.transpose(2, 3))
    scores = scores.view(B, KV, rep, q_len, k_len) * (scaling if scaling is not None else D**-0.5)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is None and causal and q_len > 1:  # queries are the last q_len positions
        attention_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    if attention_mask is not None:
        mask = attention_mask[..., :k_len]
        mask = (
            mask.view(*mask.shape[:-3], KV, rep, q_len, k_len)
            if mask.dim() == 4 and mask.shape[1] == H
            else mask.unsqueeze(-3)
        )  # (…, 1, q, k) → broadcast over (KV, rep)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    probs = torch.softmax(scores, -1, dtype=torch.float32).to(value.dtype).view(B, KV, rep * q_len, k_len)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).view(B, H, q_len, D).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_or_matmul)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_cpu_matmul_grad_attention(model) -> bool:
    """Switch an SDPA model to ``sdpa_or_matmul`` (in place). Returns whether it switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
