"""Pairwise preference losses (rlexp.algorithms.losses.pairwise): hand-computed values, and the surrogate's gradient
against the mean pair loss differentiated by autograd."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlexp.algorithms.group_stages.preference import PAIRS, rule_preference, select_pairs
from rlexp.algorithms.losses.pairwise import PairwisePreferenceLoss, pair_index, pair_loss
from tests.algorithms.batches import make_batch


def test_pair_loss_values_and_slopes_by_hand():
    x = torch.tensor([0.0, 2.0])
    value, grad = pair_loss(x, "sigmoid", 1.0)
    # -log σ(0) = log 2, slope -σ(0) = -1/2; -log σ(2) = log(1 + e^-2) = 0.12693, slope -σ(-2) = -0.11920
    assert torch.allclose(value, torch.tensor([math.log(2), 0.126928]), atol=1e-5)
    assert torch.allclose(grad, torch.tensor([-0.5, -0.119203]), atol=1e-5)
    value, grad = pair_loss(x, "ipo", 0.25)  # target 1/(2·0.25) = 2: (0 - 2)² = 4, slope 2(0 - 2) = -4; at 2: 0, 0
    assert torch.allclose(value, torch.tensor([4.0, 0.0])) and torch.allclose(grad, torch.tensor([-4.0, 0.0]))


def test_pair_index_maps_positions_to_rows():
    pairs = torch.tensor([[0, 1, 0], [-1, 0, -1], [0, 1, 0], [0, -1, 0], [1, 0, 0]], dtype=torch.float)
    w, l = pair_index(pairs, torch.tensor([0, 0, 0, 1, 1]))
    assert w.tolist() == [0, 2, 4] and l.tolist() == [1, 1, 3]


def one_pair_batch():
    # one group of two rows, row 0 wins; 2 tokens each
    batch = make_batch([1.0, 0.0], [0, 0])
    batch.extras[PAIRS] = select_pairs(rule_preference(batch.reward, batch.lengths, batch.group_ids), batch.group_ids)
    return batch


def test_dpo_coefficients_by_hand_at_the_reference():
    batch = one_pair_batch()
    logp = torch.full((2, 2), -1.0)
    batch.ref_logprobs = logp.clone()
    loss = PairwisePreferenceLoss("sigmoid", beta=1.0, base="ref")
    coef = loss.select(logp, logp, torch.zeros(2), batch.completion_mask, batch=batch)
    # x = 0: slope -1/2; N/P = 2 -> c_w = 2·1/2 = 1, c_l = -1
    assert torch.allclose(coef, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    assert math.isclose(loss.select_stats["pref/pair_loss"], math.log(2), rel_tol=1e-6)
    assert loss.select_stats["pref/pair_accuracy"] == 0.0 and loss.select_stats["pref/pairs"] == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(loss_type="sigmoid", beta=0.5, base="ref"),
        dict(loss_type="ipo", beta=0.1, base="ref", length_normalise=True),
        dict(loss_type="sigmoid", beta=0.3, base="rollout"),
        dict(loss_type="sigmoid", beta=1.0, base="none", alpha=0.1, conservative=0.5),
        dict(loss_type="sigmoid", beta=0.2, base="ref", length_normalise=True, anisotropy=2.5, anisotropy_from=1.0),
    ],
)
def test_the_surrogate_has_the_gradient_of_the_mean_pair_loss(kwargs):
    torch.manual_seed(0)
    rewards = [1.0, 0.0, 0.5, 1.0, 0.2, 0.2, 0.9]
    groups = [0, 0, 0, 1, 1, 1, 1]
    batch = make_batch(rewards, groups, lengths=[3, 2, 4, 1, 4, 3, 2], width=4)
    ids = batch.group_ids
    batch.extras[PAIRS] = select_pairs(rule_preference(batch.reward, batch.lengths, ids), ids)
    mask = batch.completion_mask
    logits = torch.randn(7, 4, requires_grad=True)
    logp = F.logsigmoid(logits)  # any differentiable log-probs
    old = (logp.detach() + 0.1 * torch.randn(7, 4)).clamp(max=0)
    batch.ref_logprobs = (logp.detach() + 0.2 * torch.randn(7, 4)).clamp(max=0)
    loss = PairwisePreferenceLoss(**kwargs)
    coef = loss.select(logp.detach(), old, torch.zeros(7), mask, batch=batch)
    out = loss(logp, old, torch.zeros(7), mask, selected=coef)
    surrogate = ((out.per_token * mask).sum(-1)).mean()  # seq-mean-token-sum
    (g_sur,) = torch.autograd.grad(surrogate, logits, retain_graph=True)

    # the direct objective: the mean over pairs of ℓ(s_w − λ s_l), s from the current log-probs
    m = mask.float()
    base = {"ref": batch.ref_logprobs, "rollout": old, "none": torch.zeros_like(old)}[kwargs["base"]]
    diff = (logp - base) * kwargs.get("alpha", 1.0)
    s = (diff * m).sum(-1)
    if kwargs.get("length_normalise"):
        s = s / m.sum(-1)
    w, l = pair_index(batch.extras[PAIRS], ids)
    x = s[w] - kwargs.get("conservative", 1.0) * s[l]
    beta = torch.full_like(x, kwargs["beta"])
    if kwargs.get("anisotropy"):
        beta = torch.where(batch.reward[w] >= kwargs["anisotropy_from"], beta * kwargs["anisotropy"], beta)
    if kwargs["loss_type"] == "sigmoid":
        direct = (-F.logsigmoid(beta * x)).mean()
    else:
        direct = ((x - 1 / (2 * beta)) ** 2).mean()
    (g_dir,) = torch.autograd.grad(direct, logits)
    assert torch.allclose(g_sur, g_dir, atol=1e-6), (g_sur - g_dir).abs().max()
    assert math.isclose(loss.select_stats["pref/pair_loss"], float(direct), rel_tol=1e-5)


def test_trust_region_term_is_k3_to_the_rollout_policy():
    batch = one_pair_batch()
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.5]]))
    loss = PairwisePreferenceLoss("sigmoid", beta=1.0, base="rollout", trust_region=0.1)
    coef = torch.zeros(2, 2)
    out = loss(logp, old, torch.zeros(2), batch.completion_mask, selected=coef)
    # k3 with r = π_old/π = 1/2 at [0, 0]: r − 1 − log r = −0.5 + 0.693147 = 0.193147; elsewhere 0
    assert torch.allclose(out.per_token, torch.tensor([[0.0193147, 0.0], [0.0, 0.0]]), atol=1e-6)
    assert torch.allclose(out.token_stats["trust_region/kl"], torch.tensor([[0.193147, 0.0], [0.0, 0.0]]), atol=1e-6)


def test_no_pairs_gives_zero_coefficients_and_bad_settings_name_the_key():
    batch = make_batch([1.0, 1.0], [0, 0])
    batch.extras[PAIRS] = torch.zeros(2, 2)
    loss = PairwisePreferenceLoss()
    batch.ref_logprobs = torch.zeros(2, 2)
    assert not loss.select(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), batch.completion_mask, batch).any()
    assert loss.select_stats == {"pref/pairs": 0.0}
    with pytest.raises(ValueError, match="loss_type='hinge'"):
        PairwisePreferenceLoss(loss_type="hinge")
    with pytest.raises(ValueError, match="base='old'"):
        PairwisePreferenceLoss(base="old")
    with pytest.raises(ValueError, match="CPL"):
        PairwisePreferenceLoss(base="ref", alpha=0.1)
    with pytest.raises(ValueError, match="reads batch.extras"):
        del batch.extras[PAIRS]
        loss.select(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), batch.completion_mask, batch)


def test_p3o_pair_advantage_is_half_the_reward_difference():
    from rlexp.algorithms.advantages.pairwise import pairwise_difference

    batch = make_batch([1.0, 0.0, 0.5, 0.2, 0.7], [0, 0, 0, 0, 1])
    # pairs (0 beats 1) and (2 beats 3); row 0 also beats 3 (two pairs: (1-0)/2 and (1-0.2)/2 -> mean 0.45)
    batch.extras[PAIRS] = torch.tensor(
        [[0, 1, 0, 1], [-1, 0, 0, 0], [0, 0, 0, 1], [-1, 0, -1, 0], [0, 0, 0, 0]], dtype=torch.float
    )
    adv = pairwise_difference(batch)
    # row 1: (0-1)/2 = -0.5; row 2: (0.5-0.2)/2 = 0.15; row 3: mean((0.2-1)/2, (0.2-0.5)/2) = mean(-0.4, -0.15)
    assert torch.allclose(adv, torch.tensor([0.45, -0.5, 0.15, -0.275, 0.0]))
