"""The loss mask in the update: an overlong-masked row contributes no gradient and is not counted by
the normalisers (the update equals the update on the batch without that row), whatever the
micro-batching."""

import copy

import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.group_stages.filters import overlong_mask
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.trainer.optimize import policy_update
from tests.algorithms.batches import tiny_policy, token_batch


def _update(batch, aggregation, micro, micro_tokens=None, share=True):
    policy = tiny_policy(seed=1)
    before = copy.deepcopy(policy.state_dict())
    algo = Algorithm(name="t", advantage=grpo, loss=ppo_clip, aggregation=aggregation)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    metrics = policy_update(
        policy,
        opt,
        None,
        batch,
        algo,
        mu=1,
        micro_batch=micro,
        temperature=1.0,
        max_grad_norm=None,
        micro_batch_tokens=micro_tokens,
        share_prompts=share,
    )
    delta = {k: policy.state_dict()[k] - before[k] for k in before}
    return delta, metrics


def _batch(truncated):
    b = token_batch()
    b.truncated = torch.tensor(truncated)
    b.advantages = torch.tensor([1.0, -0.5, 0.25, -1.0])
    return b


def test_masked_row_equals_dropped_row():
    for aggregation in ("token-mean", "seq-mean-token-mean"):
        masked = overlong_mask(_batch([False, True, False, False]))
        dropped = _batch([False, False, False, False]).select([0, 2, 3])
        d_masked, m_masked = _update(masked, aggregation, micro=0)
        d_dropped, m_dropped = _update(dropped, aggregation, micro=0)
        for k in d_masked:
            torch.testing.assert_close(d_masked[k], d_dropped[k], atol=1e-6, rtol=1e-5)
        assert abs(m_masked["loss/total"] - m_dropped["loss/total"]) < 1e-6
        assert any(v.abs().max() > 0 for v in d_masked.values())


def test_masked_update_does_not_depend_on_micro_batching():
    d_whole, _ = _update(overlong_mask(_batch([True, False, False, True])), "seq-mean-token-mean", micro=0)
    d_micro, _ = _update(overlong_mask(_batch([True, False, False, True])), "seq-mean-token-mean", micro=1)
    for k in d_whole:
        torch.testing.assert_close(d_whole[k], d_micro[k], atol=1e-6, rtol=1e-5)


def test_update_does_not_depend_on_token_budget_or_group_order():
    """Micro-batches cut by a token budget (rows 0, 3, 1, 2 in length order, prompts of 2, 1, 3, 3
    tokens: 12 positions gives [0, 3] and [1, 2], 7 gives every row alone), or by length without
    keeping groups together, give the whole batch's update."""
    d_whole, _ = _update(overlong_mask(_batch([True, False, False, True])), "token-mean", micro=0)
    for micro, tokens, share in ((0, 12, True), (0, 12, False), (3, 0, False), (0, 7, False)):
        d, _ = _update(overlong_mask(_batch([True, False, False, True])), "token-mean", micro, tokens or None, share)
        for k in d_whole:
            torch.testing.assert_close(d_whole[k], d[k], atol=1e-6, rtol=1e-5)
