"""Lp-Reg (arXiv 2510.03222): the min-p proxy and the regularised tokens, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.losses.low_probability import LpReg
from rlexp.core.forward import minp_proxy_logprobs


def test_minp_proxy_keeps_tokens_above_kappa_times_the_top_and_renormalises():
    logp_all = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    tokens = torch.tensor([1, 3])
    out = minp_proxy_logprobs(logp_all.expand(2, 4), tokens, kappa=0.2)  # keep p >= 0.1: the first three (0.95)
    assert out[0].item() == pytest.approx(math.log(0.3 / 0.95), rel=1e-5)
    assert out[1].item() == -1e4  # filtered out as noise


def test_lp_reg_regularises_the_lowest_negative_tokens_under_the_proxy():
    loss_fn = LpReg(minp=0.02, rho=0.5, beta=2.0, eps_low=0.2, eps_high=0.2)
    logp = torch.log(torch.tensor([[0.01, 0.02, 0.5, 0.03, 0.6, 0.9]]))
    old = logp.clone()
    adv = torch.tensor([[-1.0, -1.0, -1.0, -1.0, 1.0, 1.0]])
    proxy = torch.log(torch.tensor([[0.05, 0.01, 0.6, 0.04, 0.7, 0.95]]))
    mask = torch.ones(1, 6)
    # 4 negative tokens, k = ⌊0.5·4⌋ = 2: the two lowest, tokens 0 (0.01) and 1 (0.02); token 1's proxy (0.01) is
    # below the policy: not regularised; token 0 (proxy 0.05 > 0.01) is
    chosen = loss_fn.select(logp, adv, mask, proxy)
    assert chosen[0].tolist() == [True, False, False, False, False, False]
    out = loss_fn(logp, old, adv, mask, proxy_logprobs=proxy)
    d = math.log(0.05 / 0.01)
    assert out.per_token[0, 0].item() == pytest.approx(1.0 + 2.0 * (math.exp(d) - d - 1), rel=1e-5)  # −A·r + β·k3
    assert out.per_token[0, 2].item() == pytest.approx(1.0) and out.per_token[0, 4].item() == pytest.approx(-1.0)
    assert out.token_stats["lp_reg/selected_frac"][0].tolist() == [1, 0, 0, 0, 0, 0]


def test_lp_reg_needs_more_than_one_selected_token():
    loss_fn = LpReg(rho=0.01)
    logp = torch.log(torch.full((1, 4), 0.1))
    adv = torch.full((1, 4), -1.0)
    assert not loss_fn.select(logp, adv, torch.ones(1, 4), torch.zeros(1, 4)).any()  # k = max(1, 0) = 1
    with pytest.raises(ValueError, match="minp"):
        LpReg(minp=0.0)


def test_the_regularised_token_is_pushed_up_the_unselected_follow_the_surrogate():
    loss_fn = LpReg(rho=1.0, beta=1.0, eps_low=0.2, eps_high=0.2)
    logp = torch.log(torch.tensor([[0.01, 0.02]])).requires_grad_(True)
    proxy = torch.log(torch.tensor([[0.02, 0.5]]))
    out = loss_fn(logp, logp.detach(), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2), proxy_logprobs=proxy)
    out.per_token.sum().backward()
    # d/dlog p of −A·r + β·(e^Δ − Δ − 1), Δ = log π_proxy − log p, r = 1, A = −1: 1 − (e^Δ − 1); token 0: Δ = log 2,
    # gradient 0 (the KL's pull up cancels the negative advantage's push down); token 1: k3 = 25 − log 25 − 1 > 10 is
    # clamped, so only the advantage's term is left
    assert logp.grad[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert logp.grad[0, 1].item() == pytest.approx(1.0)
