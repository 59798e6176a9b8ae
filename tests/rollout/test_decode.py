import pytest
import torch

from rlexp.core.forward import token_logprobs
from rlexp.rollout.decode import Sampling, pick_tokens, sample_categorical
from rlexp.rollout.hf import HFRollout
from tests.conftest import chat_prompts


@pytest.mark.parametrize("cache,graph", [(None, None), ("static", "compile"), ("static", "capture")])
def test_greedy_loop_equals_generate(tiny, cache, graph):
    """Same tokens and log-probs as transformers generate, for left-padded prompts of different
    lengths, with the shared prefill (dynamic cache), with a static cache, and with the capturable
    buffer-state steps (run eagerly on the CPU; 12 tokens = one block of 8 and a partial one)."""
    prompts = chat_prompts(tiny.tokenizer)
    ref = HFRollout(max_new_tokens=12, engine="generate").generate(tiny.model, tiny.tokenizer, prompts, 2, greedy=True)
    out = HFRollout(
        max_new_tokens=12,
        engine="loop",
        cache_implementation=cache,
        decode_graph=graph,
        pad_to_multiple_of=64 if cache else None,
    ).generate(tiny.model, tiny.tokenizer, prompts, 2, greedy=True)
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.completion_mask, ref.completion_mask)
    assert torch.allclose(out.logprobs, ref.logprobs, atol=1e-5)
    assert out.texts == ref.texts


@pytest.mark.parametrize(
    "top_k,top_p,cache,graph", [(0, 1.0, None, None), (20, 0.9, None, None), (20, 0.9, "static", "capture")]
)
def test_loop_sampling_logprobs_equal_training_forward(tiny, top_k, top_p, cache, graph):
    torch.manual_seed(0)
    out = HFRollout(
        max_new_tokens=10,
        temperature=0.7,
        top_k=top_k,
        top_p=top_p,
        engine="loop",
        cache_implementation=cache,
        decode_graph=graph,
    ).generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 4)
    assert out.completion_ids.shape[0] == 12 and out.prompt_ids.shape[0] == 12
    lp, _ = token_logprobs(tiny.model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 0.7)
    assert float(((lp - out.logprobs) * out.completion_mask).abs().max()) < 1e-4
    assert bool((out.logprobs * (1 - out.completion_mask)).eq(0).all())


def test_captured_steps_stop_where_the_loop_stops(tiny):
    """With EOS ids that greedy decoding reaches after a few tokens, the buffer-state steps return the
    same tokens, log-probs and width as the eager loop (which stops at the step the last row
    finished), even though they run whole blocks of k = 4 steps; and a second rollout reusing the
    state gives the same again."""
    from rlexp.rollout.decode import DecodeLoop

    tok = tiny.tokenizer
    enc = tok(chat_prompts(tok), return_tensors="pt", padding=True, add_special_tokens=False, pad_to_multiple_of=64)
    greedy = Sampling(greedy=True)
    first = DecodeLoop(static=True).run(
        tiny.model, enc["input_ids"], enc["attention_mask"], 2, 16, [-1], tok.pad_token_id, greedy
    )[0]
    eos = sorted({int(first[r, 2 + r % 4]) for r in range(first.shape[0])})  # every row ends by token 6
    eager = DecodeLoop(static=True).run(
        tiny.model, enc["input_ids"], enc["attention_mask"], 2, 16, eos, tok.pad_token_id, greedy
    )
    assert eager[0].shape[1] < 16
    loop = DecodeLoop(static=True, graph="capture", stop_check_every=4)
    for _ in range(2):
        captured = loop.run(tiny.model, enc["input_ids"], enc["attention_mask"], 2, 16, eos, tok.pad_token_id, greedy)
        assert torch.equal(captured[0], eager[0])
        assert torch.allclose(captured[1], eager[1], atol=1e-6)


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_captured_steps_equal_the_eager_loop(tiny, backend):
    """decode_graph=capture_compiled: the token step traced whole by dynamo (fullgraph; the ``eager``
    backend checks the tracing fast) or compiled by Inductor (slow) gives the eager loop's greedy
    tokens and log-probs, twice (no recompilation changes them)."""
    from rlexp.rollout.decode import DecodeLoop

    tok = tiny.tokenizer
    enc = tok(chat_prompts(tok), return_tensors="pt", padding=True, add_special_tokens=False, pad_to_multiple_of=64)
    args = (enc["input_ids"], enc["attention_mask"], 2, 12, [-1], tok.pad_token_id, Sampling(greedy=True))
    eager = DecodeLoop(static=True).run(tiny.model, *args)
    loop = DecodeLoop(static=True, graph="capture_compiled", stop_check_every=4, compile_backend=backend)
    for _ in range(2):
        out = loop.run(tiny.model, *args)
        assert torch.equal(out[0], eager[0])
        assert torch.allclose(out[1], eager[1], atol=1e-5)


def test_capture_needs_the_static_loop():
    with pytest.raises(ValueError, match="rollout.decode_graph=capture"):
        HFRollout(engine="generate", cache_implementation="static", decode_graph="capture")
    with pytest.raises(ValueError, match="rollout.decode_graph=capture_compiled needs"):
        HFRollout(cache_implementation=None, decode_graph="capture_compiled")
    with pytest.raises(ValueError, match="rollout.decode_graph"):
        HFRollout(decode_graph="cudagraph")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("graph", ["capture", "capture_compiled"])
def test_captured_cuda_graph_equals_eager_steps(tiny, greedy, graph):
    """On CUDA: replaying the captured graph gives the eager steps' greedy tokens (``capture``: the same
    kernels; Inductor's may round differently) and sampled log-probs that match the training forward."""
    import copy

    from rlexp.rollout.decode import DecodeLoop

    model = copy.deepcopy(tiny.model).to("cuda")
    tok = tiny.tokenizer
    enc = tok(chat_prompts(tok), return_tensors="pt", padding=True, add_special_tokens=False, pad_to_multiple_of=64).to(
        "cuda"
    )
    s = Sampling(greedy=greedy)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    eager = DecodeLoop(static=True).run(model, ids, mask, 4, 20, [-1], tok.pad_token_id, s)
    captured = DecodeLoop(static=True, graph=graph).run(model, ids, mask, 4, 20, [-1], tok.pad_token_id, s)
    if greedy and graph == "capture":
        assert torch.equal(captured[0], eager[0])
    comp_mask = torch.ones_like(captured[0])
    lp, _ = token_logprobs(model, ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0), captured[0], comp_mask)
    assert float((lp - captured[1]).abs().max()) < 1e-3


def test_loop_micro_batches_wholechat_prompts(tiny):
    torch.manual_seed(0)
    out = HFRollout(max_new_tokens=6, micro_batch=4, engine="loop").generate(
        tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 2
    )
    assert out.completion_ids.shape[0] == 6
    assert int(out.prompt_mask.sum()) == sum(
        len(tiny.tokenizer(p, add_special_tokens=False)["input_ids"])
        for p in chat_prompts(tiny.tokenizer)
        for _ in range(2)
    )


def test_pick_tokens_filters_and_logprobs():
    """Logits ln(0.1, 0.2, 0.3, 0.4): top-k 1 and greedy pick token 3; top-p 0.5 keeps {3, 2}
    (0.4 < 0.5, 0.4 + 0.3 ≥ 0.5) and never draws 0 or 1; the log-prob is always under the
    unfiltered softmax(logits / τ)."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().repeat(4000, 1)
    tok, lp = pick_tokens(logits, Sampling(greedy=True))
    assert tok.eq(3).all() and torch.allclose(lp, torch.full_like(lp, 0.4).log())
    tok, _ = pick_tokens(logits, Sampling(top_k=1))
    assert tok.eq(3).all()
    torch.manual_seed(0)
    tok, lp = pick_tokens(logits, Sampling(top_p=0.5))
    assert set(tok.tolist()) == {2, 3}
    assert torch.allclose(lp, probs.log()[tok])
    share3 = tok.eq(3).float().mean().item()  # renormalised: 0.4 / 0.7
    assert share3 == pytest.approx(4 / 7, abs=0.03)


@pytest.mark.parametrize("method", ["race", "inverse_cdf"])
def test_categorical_samplers_draw_the_softmax(method):
    """Both samplers draw token i with probability p_i (20,000 draws, 3σ ≈ 0.01) and never draw a
    zero-probability token."""
    torch.manual_seed(0)
    p = torch.tensor([0.2, 0.0, 0.3, 0.5, 0.0])
    tok = sample_categorical(p.repeat(20000, 1), method)
    freq = torch.bincount(tok, minlength=5).float() / tok.numel()
    assert torch.allclose(freq, p, atol=0.015) and freq[1] == 0 and freq[4] == 0


def test_two_level_inverse_cdf_across_blocks():
    """Mass spread over several 256-token blocks (whole empty blocks between, a vocabulary that is not
    a multiple of the block): each token is drawn with its probability, never a zero-probability one."""
    torch.manual_seed(0)
    V = 1000
    p = torch.zeros(V)
    p[[3, 255, 256, 700, 999]] = torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15])
    tok = sample_categorical(p.repeat(20000, 1), "inverse_cdf")
    freq = torch.bincount(tok, minlength=V).float() / tok.numel()
    assert torch.allclose(freq, p, atol=0.015)
    assert set(tok.unique().tolist()) <= {3, 255, 256, 700, 999}


def test_temperature_scales_the_sampling_distribution():
    torch.manual_seed(0)
    p = torch.tensor([0.2, 0.3, 0.5])
    tok, _ = pick_tokens((p.log() * 2).repeat(20000, 1), Sampling(temperature=2.0))  # τ undoes the ×2
    assert torch.allclose(torch.bincount(tok, minlength=3).float() / tok.numel(), p, atol=0.015)


def test_rows_after_eos_are_padding_and_loop_stops_early(tiny):
    """With the EOS forced as the most likely token the loop ends after one token."""
    model = tiny.model
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    bias = torch.zeros(model.config.vocab_size)
    bias[eos] = 100.0
    handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        out = HFRollout(max_new_tokens=8, engine="loop").generate(
            model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 2
        )
    finally:
        handle.remove()
    assert out.completion_ids.shape[1] == 1 and out.completion_mask.eq(1).all() and not out.truncated.any()


def test_invalid_engine_names_the_key():
    with pytest.raises(ValueError, match="rollout.engine"):
        HFRollout(engine="vllm")
