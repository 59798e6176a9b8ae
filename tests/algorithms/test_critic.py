"""PPO critic: clipped value loss by hand, value alignment with the completion tokens, lazy build
from the policy, micro-batch-independent updates, and the Algorithm wiring."""

import copy
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.gae import gae
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.critics.ppo import Critic, ValueModel
from rlexp.algorithms.losses.clip import ppo_clip
from tests.algorithms.batches import tiny_policy, token_batch


def test_clipped_value_loss_by_hand():
    c = Critic(value_clip=0.5)
    v, old, ret, m = (
        torch.tensor([[1.0, 0.2]]),
        torch.tensor([[0.0, 0.0]]),
        torch.tensor([[2.0, 0.0]]),
        torch.ones(1, 2),
    )
    loss, clipped = c.value_loss(v, old, ret, m, total_tokens=2)
    # token 0: (1−2)² = 1 vs clipped (0.5−2)² = 2.25 → 2.25; token 1: 0.04 either way
    torch.testing.assert_close(loss, torch.tensor(0.5 * (2.25 + 0.04) / 2))
    assert clipped.tolist() == [[True, False]]
    unclipped, _ = Critic(value_clip=None).value_loss(v, old, ret, m, total_tokens=2)
    torch.testing.assert_close(unclipped, torch.tensor(0.5 * (1.0 + 0.04) / 2))
    masked, _ = c.value_loss(v, old, ret, torch.tensor([[0.0, 1.0]]), total_tokens=1)
    torch.testing.assert_close(masked, torch.tensor(0.5 * 0.04))


def test_value_of_token_t_sees_only_the_prefix_before_it():
    policy = tiny_policy()
    vm = ValueModel(policy)
    b = token_batch()
    assert vm(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask).abs().max() == 0  # zero head
    torch.nn.init.normal_(vm.head.weight)
    v1 = vm(b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    changed = b.completion_ids.clone()
    changed[0, 2] = (changed[0, 2] + 1) % 32
    v2 = vm(b.prompt_ids, b.prompt_mask, changed, b.completion_mask)
    torch.testing.assert_close(v1[0, :3], v2[0, :3])  # V before token 2 and at token 2 ignore token 2
    assert (v1[0, 3] - v2[0, 3]).abs() > 0  # V at token 3 sees token 2
    torch.testing.assert_close(v1[1:], v2[1:])
    assert (
        vm.trunk is not policy.base_model
        and vm.trunk.embed_tokens.weight.data_ptr() != policy.base_model.embed_tokens.weight.data_ptr()
    )


def _with_returns(critic, b, micro):
    ctx = SimpleNamespace(policy=None, settings=SimpleNamespace(micro_batch_size=micro), sample=None)
    critic.stage(b, ctx)
    gae(b, gamma=1.0, lam=1.0)
    return b


def test_stage_builds_lazily_and_update_is_micro_batch_independent():
    policy = tiny_policy()
    c1 = Critic(lr=1e-2, value_clip=0.5)
    b = token_batch()
    ctx = SimpleNamespace(policy=policy, settings=SimpleNamespace(micro_batch_size=0), sample=None)
    c1.stage(b, ctx)
    assert c1.model is not None and b.values.shape == (4, 4) and b.values.abs().max() == 0
    torch.nn.init.normal_(c1.model.head.weight, std=0.5)
    c2 = copy.deepcopy(c1)
    b1 = _with_returns(c1, token_batch(), 0)
    b2 = _with_returns(c2, token_batch(), 1)
    torch.testing.assert_close(b1.values, b2.values)
    m1 = c1.update(b1, mu=1, micro_batch=0)
    m2 = c2.update(b2, mu=1, micro_batch=1)
    assert m1["critic/value_loss"] == pytest.approx(m2["critic/value_loss"], abs=1e-6)
    for p1, p2 in zip(c1.model.parameters(), c2.model.parameters()):
        torch.testing.assert_close(p1, p2, atol=1e-6, rtol=1e-5)
    assert set(m1) >= {"critic/value_loss", "critic/value_clip_frac", "critic/grad_norm", "critic/explained_var"}


def test_updates_fit_the_returns():
    c = Critic(lr=3e-2, value_clip=None)
    c.build(tiny_policy())
    first = last = None
    for _ in range(15):
        b = _with_returns(c, token_batch(), 0)
        m = c.update(b, mu=1, micro_batch=0)
        first = m["critic/value_loss"] if first is None else first
        last = m["critic/value_loss"]
    assert last < 0.2 * first


def test_update_needs_returns_and_settings_are_checked():
    c = Critic()
    c.build(tiny_policy())
    with pytest.raises(ValueError, match="returns"):
        c.update(token_batch(), mu=1, micro_batch=0)
    with pytest.raises(ValueError, match="algorithm.critic.lr"):
        Critic(lr=0)
    with pytest.raises(ValueError, match="algorithm.critic.value_clip"):
        Critic(value_clip=-1)


def test_algorithm_runs_the_critic_stage_last_and_checks_its_type():
    def stage(batch, ctx):
        return batch

    critic = Critic()
    algo = Algorithm(name="ppo", advantage=gae, loss=ppo_clip, group_stages=[stage], critic=critic)
    assert algo.group_stages == [stage, critic.stage]
    with pytest.raises(ValueError, match="algorithm.critic"):
        Algorithm(name="x", advantage=gae, loss=ppo_clip, critic={"lr": 1e-5})


def test_state_dict_round_trip():
    policy = tiny_policy()
    c = Critic()
    c.build(policy)
    torch.nn.init.normal_(c.model.head.weight)
    state = c.state_dict()
    fresh = Critic()
    fresh.load_state_dict(state, policy)
    torch.testing.assert_close(fresh.model.head.weight, c.model.head.weight)
