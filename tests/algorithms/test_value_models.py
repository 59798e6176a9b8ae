"""DVPO's frozen global value model (rlexp/algorithms/critics/value_model.py, gae's outcome_reward=false) and Direct
Advantage Policy Optimization's quadratic step loss (rlexp/algorithms/losses/direct_advantage.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.gae import gae
from rlexp.algorithms.critics.ppo import ValueModel
from rlexp.algorithms.critics.value_model import FrozenValueCritic, lambda_returns, save_value_model
from rlexp.algorithms.losses.direct_advantage import direct_advantage, step_ids
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


def test_lambda_returns_by_hand():
    values = torch.tensor([[0.5, 0.2, 9.0]])  # the third token is padding
    mask = torch.tensor([[1, 1, 0]])
    # λ = 0.5: t=1: δ = 1 + 0 − 0.2 = 0.8, A = 0.8; t=0: δ = 0 + 0.2 − 0.5 = −0.3, A = −0.3 + 0.5·0.8 = 0.1
    # R = A + V = [0.6, 1.0, 0]
    r = lambda_returns(values, torch.tensor([1.0]), mask, gamma=1.0, lam=0.5)
    assert torch.allclose(r, torch.tensor([[0.6, 1.0, 0.0]]))
    # λ = 1: the Monte-Carlo return, the outcome at every valid token
    assert torch.allclose(lambda_returns(values, torch.tensor([1.0]), mask, 1.0, 1.0), torch.tensor([[1.0, 1.0, 0.0]]))


def test_gae_without_the_outcome_reward():
    batch = SimpleNamespace(
        values=torch.tensor([[0.5, 0.2]]),
        completion_mask=torch.ones(1, 2),
        reward=torch.tensor([1.0]),
        extras={},
    )
    # no outcome, γ = λ = 1: t=1: δ = 0 − 0.2; t=0: δ = 0.2 − 0.5 = −0.3, A0 = −0.5
    adv = gae(batch, gamma=1.0, lam=1.0, whiten=False, outcome_reward=False)
    assert torch.allclose(adv, torch.tensor([[-0.5, -0.2]]))
    # with the outcome (the default, PPO): +1 on both (the outcome flows back with λ = 1)
    assert torch.allclose(gae(batch, gamma=1.0, lam=1.0, whiten=False), torch.tensor([[0.5, 0.8]]))


def test_step_ids():
    b = torch.tensor([[0, 2, -1], [1, -1, -1]])
    assert step_ids(b, 4).tolist() == [[0, 0, 1, 1], [-1, 0, 0, 0]]


def test_direct_advantage_step_loss_by_hand():
    old = torch.zeros(1, 4)
    logp = torch.tensor([[0.1, 0.2, -0.1, 0.0]], requires_grad=True)
    adv = torch.tensor([[0.5, 0.5, -0.2, -0.2]])
    mask = torch.ones(1, 4)
    out = direct_advantage(logp, old, adv, mask, mc_boundaries=torch.tensor([[0, 2]]), beta=0.5)
    # steps [0, 2) and [2, 4): S = 0.3, −0.1; A/β = 1.0, −0.4; e = −0.7, 0.3; e²/2 on each token of the step
    assert torch.allclose(out.per_token, torch.tensor([[0.245, 0.245, 0.045, 0.045]]), atol=1e-6)
    assert torch.allclose(out.token_stats["direct_advantage/step_log_ratio"], torch.tensor([[0.3, 0.3, -0.1, -0.1]]))
    out.per_token.sum().backward()  # d/d logp_t of Σ e_j² = 2·e_j
    assert torch.allclose(logp.grad, torch.tensor([[-1.4, -1.4, 0.6, 0.6]]), atol=1e-6)


def test_direct_advantage_token_level_and_errors():
    logp, old = torch.tensor([[0.2, -0.1]]), torch.zeros(1, 2)
    out = direct_advantage(logp, old, torch.tensor([[0.5, -0.5]]), torch.ones(1, 2), beta=1.0, level="token")
    # e = log r − A/β = [−0.3, 0.4]
    assert torch.allclose(out.per_token, torch.tensor([[0.09, 0.16]]), atol=1e-6)
    with pytest.raises(ValueError, match="beta"):
        direct_advantage(logp, old, torch.zeros(1, 2), torch.ones(1, 2), beta=0.0)
    with pytest.raises(ValueError, match="mc_boundaries"):
        direct_advantage(logp, old, torch.zeros(1, 2), torch.ones(1, 2))


def test_frozen_critic_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="algorithm.critic \\(FrozenValueCritic\\).path"):
        FrozenValueCritic(path=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="fit_epochs"):
        FrozenValueCritic(fit_epochs=0)


@pytest.mark.long
def test_dvpo_fits_once_then_stays_frozen(tiny_cfg):
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=dvpo")).metrics
    assert m["dvpo/fitted"] == 0.0  # step 2: the GVM fitted on step 1's batch is not refitted
    assert m["dvpo/weight_change"] == 0.0 and math.isfinite(m["dvpo/value_mean"])
    assert m["advantage/abs_mean"] > 0


@pytest.mark.long
def test_dvpo_loads_a_saved_value_model(tiny_cfg, tiny, tmp_path):
    gvm = ValueModel(tiny.model)
    torch.nn.init.constant_(gvm.head.bias, 0.3)  # a "fitted" GVM: V = 0.3 on every prefix
    path = tmp_path / "gvm.pt"
    save_value_model(gvm, path)
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=dvpo", f"algorithm.critic.path={path}")).metrics
    assert m["dvpo/value_mean"] == pytest.approx(0.3, abs=1e-5) and m["dvpo/fitted"] == 0.0
    assert m["dvpo/weight_change"] == 0.0
    assert m["advantage/abs_mean"] > 0  # a constant whitens to 0: step 2's KL penalty carries the advantage


@pytest.mark.long
def test_direct_advantage_po_trains_two_steps(tiny_cfg):
    m = run(tiny_cfg(*VARYING, *FAST, "algorithm=direct_advantage_po")).metrics
    assert m["direct_advantage/states"] > 0 and math.isfinite(m["direct_advantage/value_mean"])
    assert m["direct_advantage/residual_sq"] > 0 and math.isfinite(m["loss/total"])
    assert m["train/optimizer_steps"] >= 2
