"""T-PPO: EGAE on truncated rows by hand, the critic trained on finished rows alone, and a two-step tiny run."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.gae import gae
from rlexp.algorithms.advantages.truncated import egae
from rlexp.algorithms.critics.ppo import Critic
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch, tiny_policy, token_batch
from tests.algorithms.varying_reward import VARYING


def _two_rows():
    # row 0 finished (EOS), reward 1; row 1 truncated by the window, reward 0.7 (its partial response's score)
    b = make_batch([1.0, 0.7], [0, 0], lengths=[3, 3], truncated=[False, True])
    b.values = torch.tensor([[0.5, 0.2, 0.4], [0.1, 0.3, 0.6]])
    return b


def test_egae_by_hand():
    b = _two_rows()
    adv = egae(b, gamma=1.0, lam=0.5, critic_lam=1.0, whiten=False)
    # row 0 (plain GAE, V after EOS = 0): δ2 = 1 − 0.4 = 0.6, δ1 = 0.4 − 0.2 = 0.2, δ0 = 0.2 − 0.5 = −0.3
    #   A2 = 0.6, A1 = 0.2 + 0.5·0.6 = 0.5, A0 = −0.3 + 0.5·0.5 = −0.05
    # row 1 (truncated: no reward, V(s_3) ≈ V(s_2) = 0.6): δ2 = 0 + 0.6 − 0.6 = 0, δ1 = 0.6 − 0.3 = 0.3,
    #   δ0 = 0.3 − 0.1 = 0.2; A2 = 0, A1 = 0.3, A0 = 0.2 + 0.5·0.3 = 0.35
    torch.testing.assert_close(adv, torch.tensor([[-0.05, 0.5, 0.6], [0.35, 0.3, 0.0]]))
    # returns with critic λ = 1: row 0 A = [0.5, 0.8, 0.6] + V = [1, 1, 1]; row 1 A = [0.5, 0.3, 0] + V = 0.6 each
    torch.testing.assert_close(b.extras["returns"], torch.tensor([[1.0, 1.0, 1.0], [0.6, 0.6, 0.6]]))
    assert b.stats["t_ppo/truncated_frac"] == 0.5
    assert b.stats["t_ppo/bootstrap_value_mean"] == pytest.approx(0.6)
    assert b.stats["t_ppo/critic_rows"] == 1.0


def test_egae_pays_the_truncated_reward_when_asked_and_is_gae_without_truncation():
    b = _two_rows()
    adv = egae(b, gamma=1.0, lam=0.5, whiten=False, reward_truncated=True)
    # row 1: δ2 = 0.7 + 0.6 − 0.6 = 0.7, A2 = 0.7, A1 = 0.3 + 0.35 = 0.65, A0 = 0.2 + 0.325 = 0.525
    torch.testing.assert_close(adv[1], torch.tensor([0.525, 0.65, 0.7]))
    finished = make_batch([1.0, 0.7], [0, 0], lengths=[3, 2], width=3)
    finished.values = torch.tensor([[0.5, 0.2, 0.4], [0.1, 0.3, 0.0]])
    twin = copy.deepcopy(finished)
    torch.testing.assert_close(egae(finished, lam=0.9, critic_lam=0.9), gae(twin, lam=0.9))
    torch.testing.assert_close(finished.extras["returns"], twin.extras["returns"])
    with pytest.raises(ValueError, match="algorithm.advantage.lam"):
        egae(finished, lam=1.5)


def _critic_batch(critic, truncated):
    b = token_batch()
    b.truncated = torch.tensor(truncated)
    critic.stage(b, SimpleNamespace(policy=None, settings=SimpleNamespace(micro_batch_size=0), sample=None))
    egae(b, gamma=1.0, lam=1.0)
    return b


def test_critic_trains_on_finished_rows_only():
    base = Critic(lr=1e-2, value_clip=None)
    base.build(tiny_policy())
    torch.nn.init.normal_(base.model.head.weight, std=0.5)
    only, plain = copy.deepcopy(base), copy.deepcopy(base)
    only.finished_only = True
    b = _critic_batch(only, [False, True, False, True])
    m = only.update(b, mu=1, micro_batch=0)
    # the same update as a plain critic on rows 0 and 2 alone (their returns unchanged by the selection)
    ref = plain.update(b.select([0, 2]), mu=1, micro_batch=0)
    assert m["critic/rows"] == 2.0 and m["critic/value_loss"] == pytest.approx(ref["critic/value_loss"], abs=1e-6)
    for p1, p2 in zip(only.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(p1, p2, atol=1e-6, rtol=1e-5)
    # every row truncated: no value update at all
    before = [p.detach().clone() for p in only.model.parameters()]
    m = only.update(_critic_batch(only, [True] * 4), mu=1, micro_batch=0)
    assert m["critic/rows"] == 0.0 and "critic/value_loss" not in m
    for p, q in zip(before, only.model.parameters()):
        assert torch.equal(p, q)


@pytest.mark.long
def test_t_ppo_trains_two_steps(tiny_cfg):
    # the random tiny model almost never emits EOS within 6 tokens: every row is cut by the window, so the partial
    # response's score is paid besides the bootstrap (reward_truncated) to give the policy a signal
    cfg = tiny_cfg(
        *VARYING,
        "trainer.autocast=off",
        "trainer.max_new_tokens=6",
        "trainer.num_generations=2",
        "algorithm=t_ppo",
        "algorithm.advantage.reward_truncated=true",
    )
    m = run(cfg).metrics
    assert math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert m["t_ppo/truncated_frac"] > 0 and "t_ppo/bootstrap_value_mean" in m
    assert m["t_ppo/critic_rows"] == m["critic/rows"] == round((1 - m["t_ppo/truncated_frac"]) * 4)
