"""80/20 high-entropy token selection and its wiring through Algorithm.token_loss."""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.algorithms.losses.reinforce import reinforce
from rlexp.algorithms.regularisers.entropy import high_entropy_mask


def test_top_half_by_entropy():
    ent = torch.tensor([[0.1, 0.5, 0.9, 0.3]])
    mask = torch.ones(1, 4)
    # the 0.5 quantile of 0.1, 0.3, 0.5, 0.9 interpolates to 0.4
    assert high_entropy_mask(ent, mask, 0.5).tolist() == [[False, True, True, False]]


def test_threshold_uses_valid_tokens_only_and_never_keeps_padding():
    ent = torch.tensor([[0.1, 0.2, 9.0], [0.3, 8.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # valid entropies 0.1, 0.2, 0.3: the 2/3 quantile is 0.2333… → keeps 0.3 only
    assert high_entropy_mask(ent, mask, 1 / 3).tolist() == [[False, False, False], [True, False, False]]


def test_edge_cases():
    ent = torch.tensor([[0.7, 0.0]])
    assert high_entropy_mask(ent, torch.tensor([[1, 0]]), 0.2).tolist() == [[True, False]]  # single token
    assert not high_entropy_mask(ent, torch.zeros(1, 2), 0.2).any()  # all masked
    assert high_entropy_mask(ent, torch.tensor([[1, 1]]), 1.0).tolist() == [[True, True]]
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        high_entropy_mask(ent, torch.ones(1, 2), 0.0)


def _algo(**kw):
    return Algorithm(name="t", advantage=lambda b: None, loss=reinforce, **kw)


def test_token_loss_zeroes_low_entropy_tokens_but_keeps_them_in_the_normaliser():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    ent = torch.tensor([[0.1, 0.5, 0.9, 0.3]])
    mask = torch.ones(1, 4)
    out = _algo(top_entropy_quantile=0.5).token_loss(logp, logp.detach(), torch.tensor([1.0]), mask, ent)
    torch.testing.assert_close(out.per_token.detach(), torch.tensor([[0.0, 2.0, 3.0, 0.0]]))
    loss = aggregate(out.per_token, mask, "token-mean", Normaliser.from_mask(mask))
    torch.testing.assert_close(loss.detach(), torch.tensor(5.0 / 4))
    torch.testing.assert_close(out.token_stats["entropy/selected_frac"], torch.tensor([[0.0, 1.0, 1.0, 0.0]]))


def test_token_loss_adds_kl_and_entropy_bonus():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    ent = torch.tensor([[0.4, 0.2]])
    algo = _algo(kl={"coef": 0.1, "estimator": "k3", "mode": "loss"}, entropy_coef=0.5)
    out = algo.token_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ent, ref)
    k3 = torch.exp(torch.tensor(-0.5)) + 0.5 - 1  # e^{ref−θ} − (ref−θ) − 1
    torch.testing.assert_close(out.per_token, torch.tensor([[0.1 * k3 - 0.2, -0.1]]))
    with pytest.raises(ValueError, match="reference"):
        algo.token_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ent, None)


def test_reward_mode_kl_is_not_added_to_the_loss():
    logp = torch.tensor([[-1.0]])
    algo = _algo(kl={"coef": 0.1, "estimator": "k1", "mode": "reward"})
    out = algo.token_loss(logp, logp, torch.tensor([2.0]), torch.ones(1, 1), None, torch.tensor([[-3.0]]))
    torch.testing.assert_close(out.per_token, torch.tensor([[2.0]]))


def test_invalid_quantile_names_the_key():
    with pytest.raises(ValueError, match="algorithm.top_entropy_quantile"):
        _algo(top_entropy_quantile=1.5)


def test_config_option_instantiates():
    cfg = OmegaConf.create(
        {
            "_target_": "rlexp.algorithms.algorithm.Algorithm",
            "name": "x",
            "advantage": {"_target_": "rlexp.algorithms.advantages.group.grpo", "_partial_": True},
            "loss": {"_target_": "rlexp.algorithms.losses.clip.ppo_clip", "_partial_": True},
            "top_entropy_quantile": 0.2,
        }
    )
    algo = instantiate(cfg, _convert_="all")
    assert algo.top_entropy_quantile == 0.2 and algo.loss.func is ppo_clip
