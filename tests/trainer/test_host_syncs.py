"""The device never waits for the host inside the loops that run per token or per micro-batch: the
captured decode step has no host synchronisation at all, and the policy update has as many with four
micro-batches as with one (per pass: the gradient norm; the metrics' ``tolist`` is not seen on the
CPU), so on CUDA the host queues the next micro-batch while the GPU runs the current one.
``HostSyncs`` (tests/syncs.py) sees the CPU-side equivalents of CUDA synchronisations."""

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.rollout.decode import Sampling
from rlexp.trainer.optimize import policy_update
from tests.algorithms.batches import tiny_policy, token_batch
from tests.conftest import decode_state
from tests.syncs import HostSyncs


def test_the_detector_sees_scalar_reads_and_data_dependent_shapes():
    x = torch.tensor([0.0, 1.0, 2.0])
    with HostSyncs() as s:
        float(x.sum()), x[x > 0], x.nonzero(), torch.unique(x), x.repeat_interleave(torch.tensor([1, 2, 0]))
        y = x * 2 + torch.where(x > 0, x, -x)  # none of these
    assert len(s.calls) == 5 and y.shape == (3,)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(greedy=True), Sampling(top_k=5, top_p=0.9)])
def test_captured_decode_step_never_syncs(tiny, sampling):
    state = decode_state(tiny, sampling, step=2)
    with torch.no_grad(), HostSyncs() as s:
        state.advance()
    assert s.calls == []


@pytest.mark.parametrize("share", [False, True])
def test_policy_update_syncs_once_per_pass_not_per_micro_batch(share):
    def syncs(micro):
        batch = token_batch()
        batch.advantages = torch.tensor([1.0, -0.5, 0.25, -1.0])
        if share:  # rows of a group share their prompt: the shared prompt forward runs
            batch.prompt_ids[1], batch.prompt_mask[1] = batch.prompt_ids[0], batch.prompt_mask[0]
        policy = tiny_policy()
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-3, fused=True)  # as conf/optimizer/adamw.yaml
        algo = Algorithm(name="t", advantage=grpo, loss=ppo_clip)
        with HostSyncs(host_side=("plan_micro_batches",)) as s:
            policy_update(
                policy,
                opt,
                None,
                batch,
                algo,
                mu=2,
                micro_batch=micro,
                temperature=1.0,
                max_grad_norm=1.0,
                share_prompts=share,
            )
        return s.calls

    one, four = syncs(0), syncs(1)
    # the whole-batch normalisers and token count (3), then the gradient norm of each of the μ = 2 passes
    assert len(one) == len(four) == 5, (one, four)
