"""Infinite Sampling's micro sampling groups (HFRollout(micro_group_size=g), DecodeLoop.run(micro_group=g)): a group
of G completions decoded in rounds of g over one prompt prefill gives the same tokens as the whole group at once,
with a KV cache g/G the size."""

import pytest
import torch

from rlexp.core.forward import token_logprobs
from rlexp.rollout.decode import DecodeLoop, Sampling
from rlexp.rollout.hf import HFRollout
from tests.conftest import chat_prompts


@pytest.mark.parametrize("cache", [None, "static"])
def test_micro_groups_give_the_whole_groups_tokens(tiny, cache):
    prompts = chat_prompts(tiny.tokenizer)
    outs = {}
    for g in (4, 2, 1, 3):  # 3: rounds of 3 and 1
        torch.manual_seed(0)
        outs[g] = HFRollout(
            max_new_tokens=12, temperature=0.7, micro_group_size=g, cache_implementation=cache, decode_graph=None
        ).generate(tiny.model, tiny.tokenizer, prompts, 4)
    whole = outs[4]
    assert whole.stats["rollout/micro_groups"] == 1.0
    for g in (2, 1, 3):
        assert torch.equal(outs[g].completion_ids, whole.completion_ids), g
        assert torch.allclose(outs[g].logprobs, whole.logprobs, atol=1e-5)
        assert outs[g].stats["rollout/micro_groups"] == -(-4 // g)
    if cache is None:  # the preallocated cache holds U·g rows: g/G of the whole group's
        assert outs[2].stats["rollout/kv_cache_mb"] == pytest.approx(whole.stats["rollout/kv_cache_mb"] / 2)
        assert outs[1].stats["rollout/kv_cache_mb"] == pytest.approx(whole.stats["rollout/kv_cache_mb"] / 4)
    lp, _ = token_logprobs(
        tiny.model, outs[2].prompt_ids, outs[2].prompt_mask, outs[2].completion_ids, outs[2].completion_mask, 0.7
    )
    assert float(((lp.detach() - outs[2].logprobs) * outs[2].completion_mask).abs().max()) < 1e-4


def test_micro_groups_prefill_each_prompt_once(tiny):
    """One model call with the prompts, then one-token steps only, whatever the number of rounds."""
    tok = tiny.tokenizer
    enc = tok(chat_prompts(tok), return_tensors="pt", padding=True, add_special_tokens=False)
    widths = []
    record = lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape)  # noqa: E731
    handle = tiny.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        torch.manual_seed(0)
        DecodeLoop().run(
            tiny.model, enc["input_ids"], enc["attention_mask"], 4, 5, [-1], tok.pad_token_id, Sampling(0.7), 2
        )
    finally:
        handle.remove()
    assert widths[0] == enc["input_ids"].shape
    assert all(w == (3 * 2, 1) for w in widths[1:]) and len(widths) == 1 + 2 * 4  # 2 rounds x 4 one-token steps


def test_row_streams_keep_the_sampling_distribution():
    """A row's uniform stream drawn up front still draws from softmax(logits / T) (inverse CDF)."""
    from rlexp.rollout.decode import pick_tokens

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(200_000, 4)
    torch.manual_seed(0)
    tokens, _ = pick_tokens(logits, Sampling(0.7), torch.rand(200_000, 1))
    freq = torch.bincount(tokens, minlength=4).float() / 200_000
    assert torch.allclose(freq, torch.softmax(logits[0] / 0.7, -1), atol=4e-3)


def test_bad_micro_group_settings_name_the_key():
    with pytest.raises(ValueError, match=r"rollout\.micro_group_size must be >= 0"):
        HFRollout(micro_group_size=-1)
    with pytest.raises(ValueError, match=r"rollout\.micro_group_size needs rollout\.engine=loop"):
        HFRollout(micro_group_size=2, engine="generate")
    with pytest.raises(ValueError, match=r"rollout\.micro_group_size needs rollout\.engine=loop"):
        HFRollout(micro_group_size=2, cache_implementation="static", decode_graph="capture")
