"""GTPO and GRPO-S (arXiv 2508.04349) entropy-weighted advantages, computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.entropy_weighted import grpo_s, gtpo
from rlexp.core.masks import TOKEN_ENTROPY
from tests.algorithms.batches import make_batch


def _gtpo_batch():
    # group 0: rows 0, 1 correct (lengths 2, 1), row 2 wrong (length 2); group 1: both correct (no signal)
    b = make_batch([1.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1], lengths=[2, 1, 2, 2, 2])
    b.extras[TOKEN_ENTROPY] = torch.tensor([[1.0, 2.0], [3.0, 9.0], [0.5, 0.25], [1.0, 1.0], [2.0, 2.0]])
    return b


def test_gtpo_shaped_rewards_split_normalised():
    b = _gtpo_batch()
    adv = gtpo(b, alpha1=1.0, alpha2=0.1, normalise="split")
    # position 0: O+ rows 0, 1 (d = 2, ΣH = 4): 1 + 0.1·(1/4)·2 = 1.05 and 1 + 0.1·(3/4)·2 = 1.15;
    # position 1: row 0 alone: 1 + 0.1·1·1 = 1.1; O+ tokens {1.05, 1.15, 1.1}: mean 1.1, population std √(0.005/3)
    s = math.sqrt(0.005 / 3)
    assert adv[0, 0].item() == pytest.approx(-0.05 / s, rel=1e-4)
    assert adv[1, 0].item() == pytest.approx(0.05 / s, rel=1e-4)
    assert adv[0, 1].item() == pytest.approx(0.0, abs=1e-4)
    assert adv[1, 1].item() == 0.0  # padding
    # O−: row 2 alone at each position (h = 1): −1 − 0.1 = −1.1 twice, no spread: advantage 0
    assert torch.allclose(adv[2], torch.zeros(2), atol=1e-4)
    assert torch.equal(adv[3:], torch.zeros(2, 2))  # all correct: no signal
    assert b.stats["gtpo/shaping_abs"] == pytest.approx((0.05 + 0.15 + 0.1 + 0.1 + 0.1 + 0.1 * 4) / 9, rel=1e-4)


def test_gtpo_joint_normalisation_keeps_the_correctness_signal():
    adv = gtpo(_gtpo_batch(), alpha1=1.0, alpha2=0.1, normalise="joint")
    vals = [1.05, 1.15, 1.1, -1.1, -1.1]
    mean = sum(vals) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 5)
    got = [adv[0, 0], adv[1, 0], adv[0, 1], adv[2, 0], adv[2, 1]]
    for g, v in zip(got, vals):
        assert g.item() == pytest.approx((v - mean) / std, rel=1e-4)


def test_gtpo_inverse_entropy_punishes_confident_wrong_tokens_more():
    b = make_batch([1.0, 0.0, 0.0], [0, 0, 0], lengths=[1, 1, 1], width=1)
    b.extras[TOKEN_ENTROPY] = torch.tensor([[1.0], [0.5], [2.0]])
    # O−: inverses 2 and 0.5 (sum 2.5), h = 2: −1 − 0.1·0.8·2 = −1.16 (confident), −1 − 0.1·0.2·2 = −1.04
    adv = gtpo(b, alpha1=1.0, alpha2=0.1, normalise="split")
    assert adv[1, 0] < adv[2, 0]  # the confident wrong token is pushed down harder
    assert adv[1, 0].item() == pytest.approx(-1.0, rel=1e-4) and adv[2, 0].item() == pytest.approx(1.0, rel=1e-4)


def test_grpo_s_sequence_rewards():
    b = make_batch([1.0, 1.0, 0.0, 0.0], [0, 0, 0, 0], lengths=[2, 1, 2, 2])
    b.extras[TOKEN_ENTROPY] = torch.tensor([[1.0, 2.0], [3.0, 7.0], [0.5, 0.5], [1.0, 1.0]])
    adv = grpo_s(b, beta1=1.0, beta2=0.1, eps=0.0)
    # mean entropies 1.5, 3, 0.5, 1; O+: 1 + 0.1·(1.5/4.5)·2, 1 + 0.1·(3/4.5)·2; O−: inverses 2, 1 (sum 3):
    # −1 − 0.1·(2/3)·2, −1 − 0.1·(1/3)·2
    shaped = [1 + 0.2 / 3, 1 + 0.4 / 3, -1 - 0.4 / 3, -1 - 0.2 / 3]
    mean = sum(shaped) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in shaped) / 3)
    for i, v in enumerate(shaped):
        assert adv[i].item() == pytest.approx((v - mean) / std, rel=1e-4)


def test_one_outcome_groups_get_zero_and_missing_entropy_is_refused():
    b = make_batch([0.0, 0.0], [0, 0])
    b.extras[TOKEN_ENTROPY] = torch.ones(2, 2)
    assert torch.equal(grpo_s(b), torch.zeros(2))
    with pytest.raises(ValueError, match="token_entropy"):
        gtpo(make_batch([1.0, 0.0], [0, 0]))
    with pytest.raises(ValueError, match="normalise"):
        gtpo(b, normalise="batch")


def test_positive_split_on_a_named_term():
    b = make_batch(None, [0, 0], terms=[[1.0, 0.5], [0.0, 0.5]], weights=[1.0, 1.0])
    b.extras[TOKEN_ENTROPY] = torch.ones(2, 2)
    adv = grpo_s(b, metric="t0")  # row 0 correct on t0 though both totals are >= 0.5
    assert adv[0] > 0 > adv[1]
    with pytest.raises(KeyError, match="metric"):
        grpo_s(b, metric="nope")


def test_egsw_softmax_weights_by_hand():
    from rlexp.algorithms.advantages.entropy_weighted import egsw

    b = make_batch([1.0, 0.0], [0, 0], lengths=[2, 1])
    b.extras[TOKEN_ENTROPY] = torch.tensor([[0.5, 1.5], [0.0, 9.0]])  # mean entropies 1.0 and 0.0
    a = 1 / math.sqrt(2)  # GRPO: (1 − 0.5) / std([1, 0]) with Bessel
    w0 = 1 / (1 + math.exp(-(2 * a + 0.5)))  # softmax of (a + 0.5·1, −a + 0.5·0)
    seq = egsw(b, alpha=0.5, temperature=1.0, level="sequence", eps=0.0)
    assert seq.tolist() == pytest.approx([a * 2 * w0, -a * 2 * (1 - w0)], rel=1e-5)
    tok = egsw(b, alpha=0.5, temperature=1.0, level="token", eps=0.0)
    # position 0: entropies 0.5 and 0.0; position 1: row 0 alone (weight 1)
    w = 1 / (1 + math.exp(-(2 * a + 0.25)))
    assert tok[0, 0].item() == pytest.approx(a * 2 * w, rel=1e-5)
    assert tok[1, 0].item() == pytest.approx(-a * 2 * (1 - w), rel=1e-5)
    assert tok[0, 1].item() == pytest.approx(a, rel=1e-5) and tok[1, 1].item() == 0.0
    # a very high temperature flattens the weights: GRPO's advantage
    flat = egsw(b, alpha=0.5, temperature=1e9, eps=0.0)
    assert flat.tolist() == pytest.approx([a, -a], rel=1e-5)
