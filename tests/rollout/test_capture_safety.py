"""Why the captured decode step can be replayed (``rollout.decode_graph=capture``), checked on the CPU:
a CUDA graph replays the kernels of capture time on the same addresses with the same scalar
arguments. So two consecutive ``StaticDecodeState.advance()`` calls must dispatch the identical op
sequence with identical non-tensor arguments (no Python-side step counter baked in), read only
storages that live across calls (state buffers, the static cache, the weights), make no tensor from
host data, and never synchronise (tests/trainer/test_host_syncs.py)."""

import pytest
import torch

from rlexp.rollout.decode import Sampling
from tests.conftest import decode_state
from tests.syncs import OpTrace


def _storages(*tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if torch.is_tensor(t) and t.numel()}


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(greedy=True), Sampling(temperature=0.7, top_k=5, top_p=0.9)])
def test_consecutive_steps_are_one_replayable_graph(tiny, sampling):
    state = decode_state(tiny, sampling)
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
