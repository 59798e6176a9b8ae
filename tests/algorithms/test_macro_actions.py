"""MA-RLHF's macro actions (rlexp.algorithms.advantages.macro): hand-computed cuts, σ weights and macro GAE, and a
two-step run of algorithm=ma_rlhf on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.gae import gae
from rlexp.algorithms.advantages.macro import macro_gae, macro_starts, macro_sum, macro_weights
from rlexp.core.masks import KL_PENALTY
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING


def close(x, expected, tol=1e-5):
    want = torch.tensor(expected, dtype=torch.float32)
    assert torch.allclose(torch.as_tensor(x, dtype=torch.float32), want, atol=tol)


def mask_of(lengths, width):
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


def test_fixed_ngram_cuts_and_the_last_token_alone():
    # n = 3. 8 valid tokens: macros [0,3) [3,6) [6,7) [7] (the last token is a macro of its own);
    # 7 valid: [0,3) [3,6) [6] (the cut at 6 is both the 3-gram's and the last token's); 1 valid: [0]
    starts = macro_starts(mask_of([8, 7, 1], 8), "fixed", ngram=3)
    T, F = True, False
    assert starts.tolist() == [[T, F, F, T, F, F, T, T], [T, F, F, T, F, F, T, F], [T, F, F, F, F, F, F, F]]
    # n = 1: every token is a macro (token-level PPO)
    assert macro_starts(mask_of([4], 5), "fixed", ngram=1).tolist() == [[T, T, T, T, F]]


def test_perplexity_cuts_where_the_next_token_is_less_likely():
    # log p = [-1, -2, -0.5, -3, -3] (ppl = e^{-log p}): a macro begins at t when log p_{t+1} < log p_t:
    # t=0 (-2 < -1, and the first token anyway), t=1 no (-0.5 > -2), t=2 (-3 < -0.5), t=3 no (equal), t=4 the last
    lp = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -3.0, -9.0]])
    starts = macro_starts(mask_of([5], 6), "ppl", logprobs=lp)
    assert starts.tolist() == [[True, False, True, False, True, False]]  # padding (-9) never cuts nor is cut


def test_randomized_ngram_uses_each_length_once_then_one_leftover_macro():
    torch.manual_seed(0)
    starts = macro_starts(mask_of([30], 30), "randomized", repeat_times=1)[0]
    cuts = starts.nonzero().squeeze(-1).tolist() + [30]
    lengths = [b - a for a, b in zip(cuts, cuts[1:])]
    # the lengths {1, 2, 3, 5, 10} in some order (21 tokens), the leftover 8 tokens, the last token alone
    assert sorted(lengths[:5]) == [1, 2, 3, 5, 10] and lengths[5:] == [8, 1]


def test_parsing_and_bad_settings_raise_naming_the_key():
    m = mask_of([3], 3)
    with pytest.raises(ValueError, match="termination"):
        macro_starts(m, "parsing")
    with pytest.raises(ValueError, match="termination"):
        macro_starts(m, "sentence")
    with pytest.raises(ValueError, match="ngram"):
        macro_starts(m, "fixed", ngram=0)
    with pytest.raises(ValueError, match="value_function"):
        macro_weights(macro_starts(m), m, "max")


def test_macro_value_weights_equal_unit_position():
    # one macro of 3 tokens with values [3, 6, 9], then the last token alone (value 1)
    m = mask_of([4], 4)
    starts = torch.tensor([[True, False, False, True]])
    v = torch.tensor([[3.0, 6.0, 9.0, 1.0]])
    ids, sigma, count = macro_weights(starts, m, "equal")
    assert ids.tolist() == [[0, 0, 0, 1]] and count.tolist() == [2]
    close(macro_sum(v, ids, sigma, 2), [[6.0, 1.0]])  # mean
    ids, sigma, _ = macro_weights(starts, m, "unit")
    close(macro_sum(v, ids, sigma, 2), [[9.0, 1.0]])  # the macro's last token
    ids, sigma, _ = macro_weights(starts, m, "position")
    # σ ∝ 1, 1/2, 1/3 → 6/11, 3/11, 2/11: (18 + 18 + 18) / 11
    close(macro_sum(v, ids, sigma, 2), [[54 / 11, 1.0]])


def test_macro_gae_by_hand():
    b = make_batch([1.0, 0.0], [0, 0], lengths=[5, 3], width=5)
    b.values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 2.0, 2.0, 7.0, 7.0]])  # padding values ignored
    adv = macro_gae(b, termination="fixed", ngram=2, gamma=1.0, lam=0.5, whiten=False)
    # row 0, macros [0,1] [2,3] [4]: V = 1.5, 3.5, 5; R = 0, 0, 1 (the outcome on the last token)
    #   δ3 = 1 + 0 − 5 = −4 → A3 = −4;  δ2 = 0 + 5 − 3.5 = 1.5 → A2 = 1.5 + 0.5·(−4) = −0.5
    #   δ1 = 0 + 3.5 − 1.5 = 2 → A1 = 2 + 0.5·(−0.5) = 1.75;  returns A + V = 3.25, 3, 1
    # row 1 (3 tokens), macros [0,1] [2]: V = 2, 2; R = 0, 0
    #   δ2 = 0 − 2 = −2 → A2 = −2;  δ1 = 0 + 2 − 2 = 0 → A1 = 0 + 0.5·(−2) = −1;  returns 1, 0
    close(adv, [[1.75, 1.75, -0.5, -0.5, -4.0], [-1.0, -1.0, -2.0, 0.0, 0.0]])
    close(b.extras["returns"], [[3.25, 3.25, 3.0, 3.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    assert b.stats["ma_rlhf/macro_len_mean"] == pytest.approx(8 / 5)  # 8 tokens in 5 macros
    assert b.stats["ma_rlhf/macros_per_row"] == pytest.approx(2.5)
    assert b.stats["ma_rlhf/macro_adv_abs_mean"] == pytest.approx((1.75 + 0.5 + 4 + 1 + 2) / 5)


def test_macro_gae_averages_the_kl_reward_within_a_macro():
    # one row of 3 tokens, n = 2: macros [0,1] [2]; KL penalties 0.2, 0.4, 0.6, reward after the KL charge 1 − 1.2
    # token rewards: −0.2, −0.4, −0.6 + 1 (the outcome before the charge); macro rewards (mean): −0.3, 0.4
    b = make_batch([1.0 - 1.2], [0], lengths=[3], width=3)
    b.extras[KL_PENALTY] = torch.tensor([[0.2, 0.4, 0.6]])
    b.values = torch.zeros(1, 3)
    adv = macro_gae(b, ngram=2, gamma=1.0, lam=1.0, whiten=False)
    close(adv, [[0.1, 0.1, 0.4]])  # A2 = 0.4; A1 = −0.3 + 0.4


def test_one_token_macros_are_token_level_gae():
    torch.manual_seed(1)
    b = make_batch([0.7, 0.2, 1.0], [0, 0, 1], lengths=[4, 2, 3], width=4)
    b.values = torch.randn(3, 4)
    b.extras[KL_PENALTY] = torch.rand(3, 4) * b.completion_mask
    adv = macro_gae(b, ngram=1, gamma=0.9, lam=0.8, whiten=False)
    returns = b.extras["returns"].clone()
    ref = gae(b, gamma=0.9, lam=0.8, whiten=False)
    close(adv, ref.tolist())
    close(returns, b.extras["returns"].tolist())
    assert b.stats["ma_rlhf/macro_len_mean"] == pytest.approx(1.0)


@pytest.mark.long
def test_ma_rlhf_trains_two_steps(tiny_cfg):
    from rlexp.runs.training import run

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=12", "trainer.num_generations=2"]
    result = run(tiny_cfg(*VARYING, *fast, "algorithm=ma_rlhf"))
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"]) and m["critic/value_loss"] > 0
    # 5-grams: a row of L ≥ 7 tokens has ⌈(L − 1)/5⌉ + 1 macros, so more than one token per macro on average
    assert 1.0 < m["ma_rlhf/macro_len_mean"] <= 5.0
    assert m["ma_rlhf/macros_per_row"] >= 2.0
    assert m["advantage/abs_mean"] > 0
