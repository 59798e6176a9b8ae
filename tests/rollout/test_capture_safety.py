"""Why the captured decode step can be replayed (``rollout.decode_graph=capture``), checked on the CPU:
a CUDA graph replays the kernels of capture time on the same addresses with the same scalar
arguments. So two consecutive ``StaticDecodeState.advance()`` calls must dispatch the identical op
sequence with identical non-tensor arguments (no Python-side step counter baked in), read only
storages that live across calls (state buffers, the static cache, the weights), make no tensor from
host data, and never synchronise (tests/trainer/test_host_syncs.py)."""
import pytest
import torch

from rlexp.rollout.decode import DecodeLoop, Sampling
from tests.conftest import chat_prompts
from tests.syncs import OpTrace


def _storages(*tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if torch.is_tensor(t) and t.numel()}


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(greedy=True), Sampling(temperature=0.7, top_k=5, top_p=0.9)])
def test_consecutive_steps_are_one_replayable_graph(tiny, sampling):
    tok = tiny.tokenizer
    enc = tok(chat_prompts(tok), return_tensors="pt", padding=True, add_special_tokens=False, pad_to_multiple_of=64)
    loop = DecodeLoop(static=True, graph="capture", stop_check_every=4)
    loop.run(tiny.model, enc["input_ids"], enc["attention_mask"], 2, 8, [-1], tok.pad_token_id, sampling)
    (state, _, _), = loop._states.values()
    state.t.fill_(1)
    traces = []
    with torch.no_grad():
        for _ in range(2):
            with OpTrace() as trace:
                state.advance()
            traces.append(trace)
    first, second = traces
    assert first.calls == second.calls
    assert first.fresh == [] and second.fresh == []
    cache = [x for layer in state.cache.layers for x in (layer.keys, layer.values, layer.cumulative_length)]
    stable = _storages(*vars(state).values(), *cache, *tiny.model.parameters(), *tiny.model.buffers())
    assert first.read <= stable and second.read <= stable, "a step reads a tensor that does not outlive it"
