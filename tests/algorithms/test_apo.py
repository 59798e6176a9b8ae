"""APO (arXiv 2506.21655): DADS's difficulty-adaptive KL weights and STCR's length weight, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.asymmetric import apo
from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.losses.clip import ppo_clip
from rlexp.core.masks import KL_ROW_WEIGHTS
from tests.algorithms.batches import make_batch


def _batch():
    b = make_batch(None, [0, 0, 0, 0], lengths=[10, 20, 30, 10], width=30, terms=[[1.0], [1.0], [0.0], [0.0]])
    b.reward_names = ["accuracy"]
    return b


def test_apo_weights_by_hand():
    b = _batch()
    adv = apo(b, eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # GRPO: (1 − 0.5) / std([1, 1, 0, 0]) with Bessel
    # row 2: wrong and 15 tokens longer than the correct ones' mean (15): × (2 − 1.00001^−15); row 3 is shorter: × 1
    assert adv.tolist() == pytest.approx([a, a, -a * (2 - 1.00001**-15), -a], rel=1e-6)
    # difficulty 0.5: the positives' KL weighs 1 − exp(−e·0.5); the negatives' 1
    w = 1 - math.exp(-math.e * 0.5)
    assert b.extras[KL_ROW_WEIGHTS].tolist() == pytest.approx([w, w, 1.0, 1.0])


def test_apo_leaves_all_wrong_and_all_right_groups_alone():
    b = make_batch(None, [0, 0, 1, 1], lengths=[5, 9, 5, 9], width=9, terms=[[0.0], [0.0], [1.0], [1.0]])
    b.reward_names = ["accuracy"]
    assert torch.equal(apo(b), torch.zeros(4))
    assert b.extras[KL_ROW_WEIGHTS].tolist() == [1.0] * 4
    with pytest.raises(KeyError, match="metric"):
        apo(make_batch([1.0, 0.0], [0, 0]))


def test_token_loss_weights_the_kl_per_row():
    algo = Algorithm(name="a", advantage=apo, loss=ppo_clip, kl={"coef": 0.5})
    plain = Algorithm(name="g", advantage=grpo, loss=ppo_clip, kl={"coef": 0.5})
    logp, ref = torch.zeros(2, 2), torch.full((2, 2), -1.0)
    mask, adv = torch.ones(2, 2), torch.tensor([1.0, -1.0])
    rows = torch.tensor([0.25, 1.0])
    out = algo.token_loss(logp, logp, adv, mask, ref_logp=ref, extras={KL_ROW_WEIGHTS: rows})
    base = plain.token_loss(logp, logp, adv, mask, ref_logp=ref)
    kl = base.per_token - ppo_clip(logp, logp, adv, mask).per_token
    assert torch.allclose(out.per_token, base.per_token - kl * (1 - rows[:, None]))
    assert algo.token_loss_extras == (KL_ROW_WEIGHTS,) and plain.token_loss_extras == ()
