"""VERL (arXiv 2509.23808): effective rank, its dynamics over the sequence, and the dual-channel advantage shaping,
worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.hidden_rank import (
    dual_channel_bonus,
    effective_rank,
    hidden_rank_settings,
    rank_dynamics,
    rank_statistics,
    verl_rank,
)
from rlexp.core.masks import HIDDEN_RANK
from tests.algorithms.batches import make_batch


def _er(rows, center=False, mask=None):
    h = torch.tensor(rows, dtype=torch.float32)[None]
    m = torch.ones(h.shape[:2], dtype=torch.bool) if mask is None else torch.tensor([mask])
    return effective_rank(h, m, center).item()


def test_effective_rank_of_identity_and_rank_one():
    eye = torch.eye(3).tolist()
    assert _er(eye) == pytest.approx(3.0)  # σ = (1, 1, 1): p uniform, exp(ln 3)
    assert _er(eye, center=True) == pytest.approx(2.0)  # I − 1/3: σ = (1, 1, 0)
    rank_one = [[1.0, 0, 0, 0], [2.0, 0, 0, 0], [3.0, 0, 0, 0]]  # u vᵀ
    assert _er(rank_one) == pytest.approx(1.0)
    assert _er(rank_one, center=True) == pytest.approx(1.0)  # centred u = (−1, 0, 1): still rank one


def test_effective_rank_of_unequal_singular_values():
    # σ = (3, 1): p = (3/4, 1/4), H = −(0.75 ln 0.75 + 0.25 ln 0.25) = 0.5623, ER = e^H = 1.7548
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert _er([[3.0, 0.0], [0.0, 1.0]]) == pytest.approx(math.exp(h), rel=1e-6)


def test_effective_rank_masks_padding_and_short_rows():
    # the padding row (garbage) is left out: the two valid rows e1, e2 give 2
    assert _er([[1.0, 0, 0], [0, 1.0, 0], [5.0, 7.0, 9.0]], mask=[True, True, False]) == pytest.approx(2.0)
    assert _er([[1.0, 2.0], [3.0, 4.0]], mask=[True, False]) == 0.0  # fewer than 2 vectors
    assert _er([[0.0, 0.0], [0.0, 0.0]]) == 1.0  # no spread at all: one (degenerate) direction


def test_rank_dynamics_by_hand():
    e = torch.tensor([[2.0, 4.0, 3.0, 6.0], [1.0, 3.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    erv, era = rank_dynamics(e, valid)
    # row 0: Δ = (4 − 2, 3 − 3, 6 − 3) = (2, 0, 3) → ERV 5/3; Δ² = (0 − 2, 3 − 0) → ERA 1/2
    # row 1: Δ = (3 − 1) → ERV 2, no Δ² → ERA 0; row 2: one window → 0, 0
    assert erv.tolist() == pytest.approx([5 / 3, 2.0, 0.0])
    assert era.tolist() == pytest.approx([0.5, 0.0, 0.0])


def test_rank_statistics_uses_the_decoding_states():
    # row 0 of the hidden states predicts the first token from the prompt: left out; rows 1..4 are e1..e4 (T = 5)
    h = torch.zeros(1, 5, 4)
    h[0, 0] = torch.tensor([9.0, 9.0, 9.0, 9.0])
    h[0, 1:] = torch.eye(4)
    mask = torch.ones(1, 5)
    s = rank_statistics(h, mask, stride=1, center=False)
    # 4 states: ER = 4; prefixes of 2, 3, 4 states (t = 1, 2, 3 < 4): ER 2, 3, 4
    # → Δ = (3 − 2, 4 − 2.5) = (1, 1.5), ERV 1.25; Δ² = (0.5), ERA 0.5
    assert s[0].tolist() == pytest.approx([4.0, 1.25, 0.5])
    # a completion of 4 tokens: 3 states e1..e3; stride 5 leaves no prefix window
    s = rank_statistics(h, torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]), stride=5, center=False)
    assert s[0].tolist() == pytest.approx([3.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="stride"):
        rank_statistics(h, mask, stride=0)


def test_dual_channel_bonus_by_hand():
    stats = torch.tensor([[6.0, 2.0, 1.0], [2.0, 0.0, 3.0], [40.0, 1.0, 1.0]])  # (ER, ERV, ERA)
    levels = {"er": 4.0, "erv": 1.0, "era": 1.0}
    aux, tendency = dual_channel_bonus(stats, levels, 2.0, (0.0, 0.0, 1.0), (0.0, 1.0, 0.0), 1.0)
    # row 0: d_ERA = 0 → τ = ½; d_ERV = 1, d_ER = ½ → b = ½·tanh 1 + ½·tanh ½
    # row 1: d_ERA = 2 → τ = σ(4); d_ERV = −1, d_ER = −½ → b = τ·tanh(−½) + (1 − τ)·tanh(−1)
    # row 2: d_ER = 9 clamped to 5 → b = ½·tanh 5
    t1 = 1 / (1 + math.exp(-4.0))
    assert tendency.tolist() == pytest.approx([0.5, t1, 0.5])
    expected = [
        0.5 * math.tanh(1) + 0.5 * math.tanh(0.5),
        t1 * math.tanh(-0.5) + (1 - t1) * math.tanh(-1),
        0.5 * math.tanh(5.0),
    ]
    assert aux.tolist() == pytest.approx(expected, rel=1e-6)


def test_verl_advantage_worked_example():
    b = make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    b.extras[HIDDEN_RANK] = torch.tensor([[6.0, 2.0, 1.0], [2.0, 0.0, 3.0], [4.4, 1.0, 1.0], [6.0, 2.0, 1.0]])
    levels = {}
    # first step: no levels yet → plain GRPO (±0.5/std, std = √½ with Bessel), levels set to the batch means
    adv = verl_rank(b, ema_alpha=0.3, levels=levels)
    a = 0.5 / math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([a, -a, a, -a], rel=1e-5)
    assert b.stats["verl/shaping_abs_mean"] == 0.0
    assert [levels[k] for k in ("er", "erv", "era")] == pytest.approx([4.6, 1.25, 1.5])
    levels.update(er=4.0, erv=1.0, era=1.0)
    adv = verl_rank(b, ema_alpha=0.3, levels=levels, kappa=2.0, modulation_gain=2.0)
    # b = (0.6119, < 0, ½·tanh 0.1, 0.6119); cap |A|/κ = 0.35355:
    # row 0 capped (A + 0.35355), row 1 no bonus, row 2 + 0.04983, row 3 capped (−A + 0.35355)
    b0, b2 = 0.5 * math.tanh(1) + 0.5 * math.tanh(0.5), 0.5 * math.tanh(0.1)
    assert b0 > a / 2
    assert adv.tolist() == pytest.approx([a + a / 2, -a, a + b2, -a + a / 2], rel=1e-5)
    assert b.stats["verl/shaping_abs_mean"] == pytest.approx((a / 2 + b2 + a / 2) / 4, rel=1e-5)
    assert b.stats["verl/bonus_active_frac"] == 0.75
    # levels: 0.7·(4, 1, 1) + 0.3·(4.6, 1.25, 1.5)
    assert [levels[k] for k in ("er", "erv", "era")] == pytest.approx([4.18, 1.075, 1.15])


def test_verl_needs_its_inputs():
    b = make_batch([1.0, 0.0], [0, 0])
    with pytest.raises(ValueError, match="algorithm.advantage.levels"):
        verl_rank(b)
    with pytest.raises(ValueError, match="hidden_rank"):
        verl_rank(b, levels={})
    with pytest.raises(ValueError, match="ema_alpha"):
        verl_rank(b, levels={}, ema_alpha=0.0)


def test_only_verl_asks_for_hidden_states():
    from functools import partial

    from rlexp.algorithms.advantages.group import grpo

    assert hidden_rank_settings(partial(grpo)) is None
    assert hidden_rank_settings(partial(verl_rank, stride=3)) == {"stride": 3, "center": True}
    assert hidden_rank_settings(partial(verl_rank)) == {"stride": 40, "center": True}


def test_hidden_states_of_the_forward(tiny):
    """``token_logprobs(hidden_out=...)``: the final norm's output at the positions that predict each completion token,
    the same with and without the shared prompt forward."""
    from rlexp.core.forward import padded_causal_mask, sequence_inputs, token_logprobs

    torch.manual_seed(0)
    p = torch.randint(5, 100, (4, 6))
    p[1] = p[0]
    pm = torch.ones_like(p)
    pm[:, 0] = 0
    c = torch.randint(5, 100, (4, 5))
    cm = torch.ones_like(c)
    cm[3, 3:] = 0
    got = []
    for share in (False, True):
        out = []
        token_logprobs(tiny.model, p, pm, c, cm, share_prompts=share, hidden_out=out)
        got.append(out[0])
    ids, att, pos = sequence_inputs(p, pm, c, cm)
    with torch.no_grad():
        ref = tiny.model(
            input_ids=ids, attention_mask=padded_causal_mask(att), position_ids=pos, output_hidden_states=True
        ).hidden_states[-1][:, 5:10]
    valid = cm.bool()
    assert torch.allclose(got[0], ref, atol=1e-5)
    assert torch.allclose(got[1][valid], ref[valid], atol=1e-4)


@pytest.mark.long  # the method's plain two-step run is in test_methods_run; this one checks its mechanism
def test_verl_rank_trains_two_steps(tiny_cfg):
    """algorithm=verl_rank on the tiny model (8 tokens: stride 1 for the prefix windows): the first step sets the
    levels, the second is shaped."""
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    fast = ["trainer.autocast=off", "trainer.max_new_tokens=8"]
    result = run(tiny_cfg(*VARYING, *fast, "algorithm=verl_rank", "algorithm.advantage.stride=1"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["grad_norm"])
    assert m["verl/effective_rank_mean"] > 1.0 and m["verl/erv_mean"] != 0.0 and m["verl/era_mean"] != 0.0
    assert m["verl/shaping_abs_mean"] > 0 and 0.0 < m["verl/bonus_active_frac"] <= 1.0
