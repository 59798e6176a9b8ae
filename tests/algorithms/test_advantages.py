"""Advantage estimators on hand-computed examples (edge cases: zero-variance groups, singleton
groups, all-masked rows, single-token completions)."""

import math

import pytest
import torch

from rlexp.algorithms.advantages.baselines import opo, remax
from rlexp.algorithms.advantages.beta import bnpo
from rlexp.algorithms.advantages.gae import gae
from rlexp.algorithms.advantages.group import gpg, grpo
from rlexp.algorithms.advantages.leave_one_out import rloo
from rlexp.algorithms.advantages.multi_reward import gdpo
from rlexp.algorithms.advantages.reinforce import raw_reward, reinforce_pp, reinforce_pp_baseline
from tests.algorithms.batches import make_batch


def close(x, expected, tol=1e-5):
    torch.testing.assert_close(x.float(), torch.tensor(expected, dtype=torch.float32), atol=tol, rtol=0)


# ---- GRPO scalings reused by Dr. GRPO (none) and Lite PPO (batch) ----------------------------------


def test_group_mean_without_std_dr_grpo():
    b = make_batch([1, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1])
    close(grpo(b, scale="none"), [0.5, -0.5, -0.5, 0.5, 0, 0])


def test_group_mean_batch_std_lite_ppo():
    # batch of six 1s and two 0s: Bessel std = sqrt(1.5 / 7)
    b = make_batch([1, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1])
    s = math.sqrt(1.5 / 7)
    close(grpo(b, scale="batch", eps=0.0), [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0])


# ---- RLOO -------------------------------------------------------------------------------------------


def test_rloo_leave_one_out_zero_variance_and_singleton():
    b = make_batch([1, 0, 0, 1, 1, 1, 1, 0.5], [0, 0, 0, 0, 1, 1, 1, 2])
    # r_0 − mean(0, 0, 1) = 1 − 1/3
    close(rloo(b), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0])


# ---- REINFORCE++ ------------------------------------------------------------------------------------


def test_reinforce_pp_whitens_token_returns_over_the_batch():
    # tokens: row 0 → 1, 1; row 1 (single token) → 0. mean 2/3, Bessel var 1/3
    b = make_batch([1, 0], [0, 1], lengths=[2, 1])
    s = math.sqrt(1 / 3)
    close(reinforce_pp(b, eps=0.0), [[(1 / 3) / s, (1 / 3) / s], [(-2 / 3) / s, 0.0]])


def test_reinforce_pp_discounts_the_outcome_reward():
    # γ = 0.5: row 0 returns 0.5, 1; row 1: 0 → mean 0.5, Bessel var 0.25
    b = make_batch([1, 0], [0, 1], lengths=[2, 1])
    close(reinforce_pp(b, gamma=0.5, eps=0.0), [[0.0, 1.0], [-1.0, 0.0]])


def test_reinforce_pp_baseline_centres_by_group_then_whitens_tokens():
    b = make_batch([1, 0, 1], [0, 0, 1], lengths=[2, 1, 1])
    # centred: 0.5, -0.5, and the singleton keeps 1 (baseline 0); tokens 0.5, 0.5, -0.5, 1
    mean = 1.5 / 4
    std = math.sqrt(((0.5 - mean) ** 2 * 2 + (-0.5 - mean) ** 2 + (1 - mean) ** 2) / 3)
    hi, lo, one = (0.5 - mean) / std, (-0.5 - mean) / std, (1 - mean) / std
    close(reinforce_pp_baseline(b, eps=0.0), [[hi, hi], [lo, 0.0], [one, 0.0]])


def test_whiten_with_fewer_than_two_tokens_is_zero_not_nan():
    b = make_batch([1.0], [0], lengths=[1])
    close(reinforce_pp(b), [[0.0]])
    empty = make_batch([1.0, 0.0], [0, 1], lengths=[0, 0])
    close(reinforce_pp(empty), [[0.0], [0.0]])


# ---- ReMax ------------------------------------------------------------------------------------------


def test_remax_subtracts_the_greedy_reward():
    b = make_batch([1, 0, 0.5], [0, 0, 1])
    b.extras["greedy_reward"] = torch.tensor([0.5, 0.5, 1.0])
    close(remax(b), [0.5, -0.5, -0.5])


def test_remax_without_greedy_stage_names_the_stage():
    with pytest.raises(KeyError, match="greedy_baseline"):
        remax(make_batch([1, 0], [0, 0]))


# ---- OPO --------------------------------------------------------------------------------------------


def test_opo_length_weighted_baseline():
    # b = (2·1 + 4·0 + 6·1) / 12 = 2/3; group 1 has only empty completions; group 2 is a singleton
    b = make_batch([1, 0, 1, 1, 0, 1], [0, 0, 0, 1, 1, 2], lengths=[2, 4, 6, 0, 0, 1], width=6)
    close(opo(b), [1 / 3, -2 / 3, 1 / 3, 0, 0, 0])


# ---- GPG --------------------------------------------------------------------------------------------


def test_gpg_rescales_by_the_share_of_informative_samples():
    b = make_batch([1, 0, 1, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1])
    close(gpg(b), [1, -1, 1, -1, 0, 0, 0, 0])  # α = 8 / 4


def test_gpg_alpha_is_capped_at_one_over_min_valid_frac():
    rewards = [1, 0] + [1, 1] * 20  # 2 informative samples of 42: α would be 21
    groups = [g for g in range(21) for _ in range(2)]
    b = make_batch(rewards, groups)
    adv = gpg(b)  # default cap 1 / 0.5 = 2, the bound the released code's resampling gives
    close(adv[:2], [1.0, -1.0])
    assert adv[2:].abs().max() == 0
    close(gpg(b, min_valid_frac=0.05)[:2], [10.0, -10.0])  # an older commit's floor
    with pytest.raises(ValueError, match="gpg.min_valid_frac"):
        gpg(b, min_valid_frac=0.0)


def test_gpg_all_groups_degenerate_gives_zero():
    close(gpg(make_batch([1, 1, 0, 0], [0, 0, 1, 1])), [0, 0, 0, 0])


# ---- BNPO -------------------------------------------------------------------------------------------


def test_bnpo_beta_weights():
    # p = 0.25, 0.5, 0.75: mean 0.5, unbiased var 0.0625 → a = b = 1.5 → α = β = 1.5.
    # Beta(1.5, 1.5).pdf(p) = sqrt(p(1-p)) / (π/8): 1/pdf = π/(2√3) at 0.25 and 0.75, π/4 at 0.5.
    rewards = [1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0]
    groups = [0] * 4 + [1] * 4 + [2] * 4
    w_q, w_h = math.pi / (2 * math.sqrt(3)), math.pi / 4
    expected = [0.75 * w_q] + [-0.25 * w_q] * 3 + [0.5 * w_h] * 2 + [-0.5 * w_h] * 2 + [0.25 * w_q] * 3 + [-0.75 * w_q]
    close(bnpo(make_batch(rewards, groups)), expected)


def test_bnpo_single_group_is_uniform_beta_and_range_is_checked():
    close(bnpo(make_batch([1, 0, 0, 0], [0, 0, 0, 0])), [0.75, -0.25, -0.25, -0.25])
    with pytest.raises(ValueError, match="max_value"):
        bnpo(make_batch([1.2, 0], [0, 0]))
    # rewards in [0, 2] mapped to [0, 1] with max_value=2
    close(bnpo(make_batch([2, 0], [0, 0]), max_value=2.0), [0.5, -0.5])


def test_bnpo_decomposition_averages_per_term_advantages_by_reward_weight():
    terms = [[1, 1], [0, 1], [0, 0], [0, 0]]  # one group; term 0 p=0.25, term 1 p=0.5
    t0 = [0.75, -0.25, -0.25, -0.25]
    t1 = [0.5, 0.5, -0.5, -0.5]
    # weights 1 and 0.2: (1·A0 + 0.2·A1) / 1.2 — format counts as much as it does in the reward
    b = make_batch([1.2, 0.2, 0, 0], [0, 0, 0, 0], terms=terms, weights=[1.0, 0.2])
    close(bnpo(b, decompose=True), [(x + 0.2 * y) / 1.2 for x, y in zip(t0, t1)])
    # equal weights (the released code's accuracy + format): the plain mean of the per-term advantages
    b = make_batch([2, 1, 0, 0], [0, 0, 0, 0], terms=terms, weights=[1.0, 1.0])
    close(bnpo(b, decompose=True), [(x + y) / 2 for x, y in zip(t0, t1)])


# ---- GDPO -------------------------------------------------------------------------------------------


def test_gdpo_normalises_each_term_in_its_group_then_the_batch():
    terms = [[1, 0], [0, 0], [1, 1], [1, 0]]
    b = make_batch([1, 0, 1.5, 1], [0, 0, 1, 1], terms=terms, weights=[1.0, 0.5])
    z = 1 / math.sqrt(2)  # (±0.5) / Bessel std of two values (√0.5)
    total = [z, -z, 0.5 * z, -0.5 * z]  # term 0 varies in group 0, term 1 in group 1
    s = math.sqrt(sum(t * t for t in total) / 3)
    close(gdpo(b), [t / s for t in total], tol=1e-4)
    close(gdpo(b, batch_normalize=False), total, tol=1e-4)


def test_gdpo_zero_variance_everywhere_is_zero():
    b = make_batch([1, 1], [0, 0], terms=[[1, 0], [1, 0]])
    close(gdpo(b), [0, 0])


# ---- GAE --------------------------------------------------------------------------------------------


def test_gae_lambda_one_is_return_minus_value():
    b = make_batch([1.0, 0.0, 1.0], [0, 0, 1], lengths=[3, 2, 0], width=3)
    b.values = torch.tensor([[0.5, 0.2, 0.1], [0.3, 0.4, 9.9], [7.0, 7.0, 7.0]])  # padding values ignored
    adv = gae(b, gamma=1.0, lam=1.0, whiten=False)
    close(adv, [[0.5, 0.8, 0.9], [-0.3, -0.4, 0.0], [0.0, 0.0, 0.0]])
    close(b.extras["returns"], [[1, 1, 1], [0, 0, 0], [0, 0, 0]])


def test_gae_discounting_by_hand():
    b = make_batch([1.0], [0], lengths=[3], width=3)
    b.values = torch.tensor([[0.5, 0.2, 0.1]])
    # δ2 = 1 − 0.1 = 0.9; δ1 = 0.9·0.1 − 0.2 = −0.11; δ0 = 0.9·0.2 − 0.5 = −0.32; γλ = 0.45
    a2 = 0.9
    a1 = -0.11 + 0.45 * a2
    a0 = -0.32 + 0.45 * a1
    close(gae(b, gamma=0.9, lam=0.5, whiten=False), [[a0, a1, a2]])
    close(b.extras["returns"], [[a0 + 0.5, a1 + 0.2, a2 + 0.1]])


def test_gae_whitening_and_missing_values():
    b = make_batch([1.0, 0.0], [0, 0], lengths=[2, 2])
    b.values = torch.zeros(2, 2)
    adv = gae(b, gamma=1.0, lam=1.0, whiten=True, eps=0.0)  # raw 1, 1, 0, 0 → ±0.5 / sqrt(1/3)
    s = math.sqrt(1 / 3)
    close(adv, [[0.5 / s, 0.5 / s], [-0.5 / s, -0.5 / s]])
    with pytest.raises(ValueError, match="critic"):
        gae(make_batch([1.0], [0]))


# ---- plain reward -----------------------------------------------------------------------------------


def test_raw_reward_baselines():
    b = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    close(raw_reward(b), [1, 0, 0.5, 0.5])
    close(raw_reward(b, baseline="batch"), [0.5, -0.5, 0, 0])
    close(raw_reward(b, baseline="group"), [0.5, -0.5, 0, 0])
    with pytest.raises(ValueError, match="baseline"):
        raw_reward(b, baseline="median")


def _verl_grpo_passk(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl's compute_grpo_passk_outcome_advantage (core_algos.py), transcribed for the parity test: a loop over
    groups, torch.topk(·, 2) for the best two, the advantage on the best row only."""
    from collections import defaultdict

    advantages = torch.zeros_like(scores)
    id2scores, id2indices = defaultdict(list), defaultdict(list)
    for i in range(scores.shape[0]):
        id2scores[index[i]].append(scores[i])
        id2indices[index[i]].append(i)
    for idx in id2scores:
        rewards = torch.stack(id2scores[idx])
        topk, topk_idx = torch.topk(rewards, 2)
        advantage = topk[0] - topk[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(rewards) + epsilon)
        advantages[id2indices[idx][topk_idx[0].item()]] = advantage
    return advantages


def test_passk_hand_computed_and_matches_verl():
    from rlexp.algorithms.advantages.best_of_group import passk

    # group 0: rewards 1, 0, 0.5 → best row 0, r_max − r_second = 0.5, std = 0.5 → 0.5 / 0.5 ≈ 1
    # group 1: rewards 0.2, 0.9 → best row 4, 0.7 / std(0.2, 0.9) = 0.7 / 0.495
    b = make_batch([1.0, 0.0, 0.5, 0.2, 0.9], [0, 0, 0, 1, 1])
    adv = passk(b)
    expected = torch.tensor([0.5 / (0.5 + 1e-6), 0, 0, 0, 0.7 / (torch.tensor([0.2, 0.9]).std().item() + 1e-6)])
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-6)
    torch.manual_seed(0)
    r = torch.rand(24)
    groups = [i // 4 for i in range(24)]
    b = make_batch(r.tolist(), groups)
    torch.testing.assert_close(passk(b), _verl_grpo_passk(r, groups), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(passk(b, scale=False), _verl_grpo_passk(r, groups, norm_adv_by_std_in_grpo=False))
    with pytest.raises(ValueError, match="at least 2 completions"):
        passk(make_batch([1.0, 0.0, 1.0], [0, 0, 1]))


def test_shifted_baseline_hand_computed():
    """AsymRE: group (1, 0, 0, 1) has mean 0.5, baseline 0.4: A = 0.6, −0.4, −0.4, 0.6; a singleton keeps its
    reward. OPMD's logavgexp with τ = 1 on (1, 0): log((e + 1)/2) = 0.6201."""
    from rlexp.algorithms.advantages.shifted import shifted_baseline

    b = make_batch([1.0, 0.0, 0.0, 1.0, 0.7], [0, 0, 0, 0, 1])
    torch.testing.assert_close(shifted_baseline(b, "mean", -0.1), torch.tensor([0.6, -0.4, -0.4, 0.6, 0.7]))
    b = make_batch([1.0, 0.0], [0, 0])
    soft = math.log((math.e + 1) / 2)
    torch.testing.assert_close(shifted_baseline(b, "logavgexp", tau=1.0), torch.tensor([1 - soft, -soft]))
    # τ → large: the mean; τ → small: the max
    assert shifted_baseline(b, "logavgexp", tau=1e4)[0].item() == pytest.approx(0.5, abs=1e-3)
    assert shifted_baseline(b, "logavgexp", tau=1e-3)[0].item() == pytest.approx(0.0, abs=1e-2)
    with pytest.raises(ValueError, match="baseline='median'"):
        shifted_baseline(b, "median")


def test_reinforce_pp_charges_each_token_the_kl_to_the_end():
    """One completion of 3 tokens, outcome reward 1, per-token penalties β·KL = 0.1, 0.2, 0.3: the trainer
    logs reward 1 − 0.6 = 0.4 and the returns are G = 1 − (0.6, 0.5, 0.3) = (0.4, 0.5, 0.7), then whitened
    over the batch's tokens (a second row, reward 0 and no KL, has returns 0, 0, 0)."""
    from rlexp.algorithms.advantages.reinforce import _reverse_discounted_sum
    from rlexp.core.masks import KL_PENALTY
    from rlexp.core.stats import masked_whiten

    b = make_batch([0.4, 0.0], [0, 1], lengths=[3, 3], width=3)
    b.extras[KL_PENALTY] = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 0.0]])
    mask = b.completion_mask
    expected_returns = torch.tensor([[0.4, 0.5, 0.7], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(reinforce_pp(b), masked_whiten(expected_returns, mask) * mask, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_reverse_discounted_sum(torch.tensor([[1.0, 1.0, 1.0]]), 0.5),
                               torch.tensor([[1.75, 1.5, 1.0]]))  # fmt: skip
    # without per-token penalties: the outcome reward at every token (the first token's return is the same)
    del b.extras[KL_PENALTY]
    flat = torch.tensor([[0.4, 0.4, 0.4], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(reinforce_pp(b), masked_whiten(flat, mask) * mask)


def test_gdpo_with_one_reward_term_is_grpo():
    b = make_batch([1.0, 0.0, 0.5, 1.0, 1.0, 0.0], [0, 0, 0, 1, 1, 1])
    torch.testing.assert_close(gdpo(b), grpo(b))
    assert not torch.allclose(gdpo(b, single_term_grpo=False), grpo(b))  # batch standardisation changes it
