"""COPO's consistency-aware advantage and blended loss, worked by hand."""

import math

import pytest
import torch

from rlexp.algorithms.advantages.consistency_aware import blend_weight, consistency_coef, copo, entropy_bits
from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.losses.consistency_blend import GLOBAL_ADV, LOCAL_WEIGHT, copo_clip
from rlexp.core.masks import ANSWER_CLUSTER
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING

SIG_M5 = 1 / (1 + math.exp(5))  # σ(−5) = 0.0066929
SIG_25 = 1 / (1 + math.exp(-2.5))  # σ(2.5) = 0.9241418


def _batch():
    # g0: all right, one answer (H = 0); g1: all wrong, two answers 2/2 (H = 1 bit);
    # g2: half right, answers {0: 2, 1: 1, 2: 1} (H = 0.5·1 + 2·0.25·2 = 1.5 bits)
    b = make_batch([1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0], [0] * 4 + [1] * 4 + [2] * 4)
    b.extras[ANSWER_CLUSTER] = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 2])
    return b


def test_blend_weight_at_zero_and_maximal_entropy():
    # γ = 5, ρ = 1: H = 0 (every outcome/answer equal) -> σ(−5), the global loss dominates
    assert float(blend_weight(torch.tensor(0.0), 5.0, 1.0)) == pytest.approx(0.0066929, abs=1e-6)
    # half right, half wrong: outcome entropy 1 bit (its maximum) -> σ(0) = 1/2
    assert entropy_bits([1.0, 1.0, 0.0, 0.0]) == pytest.approx(1.0)
    assert float(blend_weight(torch.tensor(1.0), 5.0, 1.0)) == pytest.approx(0.5)
    # four distinct answers: 2 bits (log2 4, the maximum for n = 4) -> σ(5) = 0.9933071, the local loss dominates
    assert entropy_bits(["a", "b", "c", "d"]) == pytest.approx(2.0)
    assert float(blend_weight(torch.tensor(2.0), 5.0, 1.0)) == pytest.approx(0.9933071, abs=1e-6)


def test_consistency_coefficient_by_hand():
    # λ = (1 − 1/4)/log2 4 = 0.375; 1 − 0.375·1.5 = 0.4375
    assert consistency_coef(1.5, 4) == pytest.approx(0.4375)
    assert consistency_coef(0.0, 1) == 1.0


def test_global_advantage_and_weights_by_hand():
    b = _batch()
    local = copo(b)
    # local = GRPO: 0 for the uniform groups g0, g1; g2: (r − 0.5)/std, std = sqrt(4·0.25/3) = 0.57735 -> ±0.86603
    torch.testing.assert_close(local, grpo(_batch()))
    assert local[:8].abs().sum() == 0
    torch.testing.assert_close(local[8:], torch.tensor([0.86603, -0.86603, 0.86603, -0.86603]), atol=1e-5, rtol=0)
    # R_g = [1, 0, 0.5]: mean 0.5, unbiased std 0.5 -> A_glob = [1, −1, 0]
    torch.testing.assert_close(
        b.extras[GLOBAL_ADV], torch.tensor([1.0] * 4 + [-1.0] * 4 + [0.0] * 4), atol=1e-5, rtol=0
    )  # ε = 1e-6
    # w = σ(5(H − 1))·1[r ≠ 0]: g0 σ(−5); g1 wrong -> 0; g2 σ(2.5) on the right rows, 0 on the wrong ones
    w = torch.tensor([SIG_M5] * 4 + [0.0] * 4 + [SIG_25, 0.0, SIG_25, 0.0])
    torch.testing.assert_close(b.extras[LOCAL_WEIGHT], w)
    # mean(1 − w) = (4·0.9933071 + 4 + 2·0.0758582 + 2)/12 = 0.8437454
    assert b.stats["copo/global_weight_mean"] == pytest.approx(0.8437454, abs=1e-6)
    assert b.stats["copo/uniform_group_frac"] == pytest.approx(2 / 3)
    assert b.stats["copo/global_adv_abs_mean"] == pytest.approx(2 / 3, abs=1e-5)
    assert b.stats["copo/uniform_global_adv_abs_mean"] == pytest.approx(1.0, abs=1e-5)
    assert b.stats["copo/entropy_mean"] == pytest.approx(10 / 12)
    # gate=none (the release's only-soft): the wrong rows keep σ(5(H − 1)) too; g1 H = 1 -> 0.5
    b2 = _batch()
    copo(b2, gate="none")
    assert b2.extras[LOCAL_WEIGHT][4:8].tolist() == [0.5] * 4
    # entropy_of=outcome: g2 half right -> H = 1 bit -> w = 0.5 on its right rows; needs no answer clusters
    b3 = make_batch([1, 0, 1, 0], [0] * 4)
    copo(b3, entropy_of="outcome")
    assert b3.extras[LOCAL_WEIGHT].tolist() == [0.5, 0.0, 0.5, 0.0]


def test_uniform_groups_get_a_gradient_where_grpo_has_none():
    b = _batch()
    local = copo(b)
    logp = torch.zeros(12, 2, requires_grad=True)
    out = copo_clip(logp, logp.detach(), local, torch.ones(12, 2), b.extras[GLOBAL_ADV], b.extras[LOCAL_WEIGHT])
    out.per_token.sum().backward()
    # at r = 1: ∂ℓ/∂logp = −(w·A_loc + (1 − w)·A_glob); g0: −(1 − σ(−5))·1 = −0.9933071, g1: −(1·(−1)) = +1
    assert logp.grad[0, 0] == pytest.approx(-(1 - SIG_M5), abs=1e-5)
    assert logp.grad[4, 0] == pytest.approx(1.0, abs=1e-5)
    grpo_logp = torch.zeros(12, 2, requires_grad=True)
    grpo_out = copo_clip(grpo_logp, grpo_logp.detach(), local, torch.ones(12, 2), torch.zeros(12), torch.ones(12))
    grpo_out.per_token.sum().backward()  # w = 1, A_glob = 0: GRPO's loss, no gradient on g0, g1
    assert grpo_logp.grad[:8].abs().sum() == 0 and logp.grad[:8].abs().min() > 0.99


def test_blend_of_clipped_losses_is_not_clipped_blend():
    # one token, r = 1.5, A_loc = +1, A_glob = −1, w = 1/2, ε = 0.2:
    # local −min(1.5, 1.2) = −1.2; global −min(−1.5, −1.2) = 1.5; blend 0.15 (the blended advantage 0 would give 0)
    logp = torch.tensor([[math.log(1.5)]])
    out = copo_clip(
        logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), torch.tensor([-1.0]), torch.tensor([0.5])
    )
    assert float(out.per_token) == pytest.approx(0.15, abs=1e-6)
    assert float(out.token_stats["copo/global_clip_frac"]) == 0.0  # A_glob < 0 with r > 1 + ε: not clipped
    assert float(out.token_stats["clip/region_frac"]) == 1.0


def test_bad_settings_name_the_key():
    b = _batch()
    with pytest.raises(ValueError, match="algorithm.advantage.gamma"):
        copo(b, gamma=-1.0)
    with pytest.raises(ValueError, match="algorithm.advantage.entropy_of"):
        copo(b, entropy_of="token")
    with pytest.raises(ValueError, match="algorithm.advantage.gate"):
        copo(b, gate="zero")
    with pytest.raises(ValueError, match="algorithm.advantage.scale"):
        copo(b, scale="std")
    with pytest.raises(KeyError, match="AnswerVotes"):
        copo(make_batch([0.0, 1.0], [0, 0]))
    with pytest.raises(ValueError, match="copo_global_adv"):
        copo_clip(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1))


def test_copo_trains_two_steps_with_its_mechanism(tiny_cfg):
    fast = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=4"]
    result = run(tiny_cfg(*VARYING, *fast, "algorithm=copo"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert "votes/no_answer_group_frac" in m  # the answer-vote stage ran; the entropy reads its clusters
    assert 0.0 < m["copo/global_weight_mean"] <= 1.0
    assert m["copo/global_adv_abs_mean"] > 0 and "copo/uniform_group_frac" in m
    assert "copo/global_clip_frac" in m  # the blended loss ran
