"""The Policy Cliff's reward perturbation (arXiv 2507.20150): a seeded δ appended to the reward as its own column."""

from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.reward_perturbation import RewardPerturbation
from tests.algorithms.batches import make_batch


def _ctx(step, seed=0):
    return SimpleNamespace(step=step, settings=SimpleNamespace(seed=seed))


def test_gaussian_perturbation_with_a_fixed_seed():
    b = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    RewardPerturbation(scale=0.1, mode="gaussian")(b, _ctx(step=3, seed=7))
    # the draws: torch.randn(4) from a generator seeded 7·1_000_003 + 3
    z = torch.randn(4, generator=torch.Generator().manual_seed(7 * 1_000_003 + 3))
    delta = 0.1 * z
    assert b.reward_names == ["r", "policy_cliff/perturbation"]
    assert b.term("policy_cliff/perturbation").tolist() == pytest.approx(delta.tolist())
    assert b.reward.tolist() == pytest.approx((torch.tensor([1.0, 0.0, 0.5, 0.5]) + delta).tolist())
    assert b.term("r").tolist() == [1.0, 0.0, 0.5, 0.5]  # the clean term stays
    assert b.stats["policy_cliff/perturbation_abs_mean"] == pytest.approx(float(delta.abs().mean()))
    assert b.stats["policy_cliff/perturbation_mean"] == pytest.approx(float(delta.mean()))
    # the same seed and step: the same draws; another step: others; scale 0: no change
    again = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    RewardPerturbation(scale=0.1, seed=7)(again, _ctx(step=3, seed=99))  # the stage's own seed wins
    assert again.reward.tolist() == pytest.approx(b.reward.tolist())
    other = make_batch([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    RewardPerturbation(scale=0.1)(other, _ctx(step=4, seed=7))
    assert other.reward.tolist() != pytest.approx(b.reward.tolist())
    zero = make_batch([1.0, 0.0], [0, 0])
    RewardPerturbation(scale=0.0)(zero, _ctx(step=1))
    assert zero.reward.tolist() == [1.0, 0.0] and zero.stats["policy_cliff/perturbation_abs_mean"] == 0.0


def test_uniform_and_systematic_modes():
    big = make_batch([0.0] * 4000, [0] * 4000)
    RewardPerturbation(scale=0.2, mode="uniform")(big, _ctx(step=1))
    d = big.term("policy_cliff/perturbation")
    assert float(d.abs().max()) <= 0.2  # bounded by the scale
    assert big.stats["policy_cliff/perturbation_abs_mean"] == pytest.approx(0.1, abs=0.01)  # E|U(−.2, .2)| = .1
    # systematic: one draw per prompt, the same at every step and for every row of the prompt
    stage = RewardPerturbation(scale=0.5, mode="systematic")
    first = make_batch([0.0] * 4, [0, 0, 1, 1])
    stage(first, _ctx(step=1))
    later = make_batch([0.0] * 4, [0, 0, 1, 1])
    stage(later, _ctx(step=9))
    a = first.term("policy_cliff/perturbation")
    assert a.tolist() == pytest.approx(later.term("policy_cliff/perturbation").tolist())
    assert float(a[0]) == float(a[1]) and float(a[2]) == float(a[3]) and float(a[0]) != float(a[2])
    with pytest.raises(ValueError, match="mode"):
        RewardPerturbation(mode="flip")
    with pytest.raises(ValueError, match="scale"):
        RewardPerturbation(scale=-1.0)


def test_policy_cliff_experiment_runs_two_steps(tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    cfg = tiny_cfg(*VARYING, "+experiment=policy_cliff", "trainer.autocast=off", "trainer.max_new_tokens=6")
    assert cfg.algorithm.entropy_coef == 0.001 and cfg.algorithm.group_stages[0].scale == 0.05
    m = run(cfg).metrics
    assert m["policy_cliff/perturbation_abs_mean"] > 0 and "reward/policy_cliff/perturbation/mean" in m
    assert "entropy/mean" in m
