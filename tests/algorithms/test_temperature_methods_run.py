"""EAD and HAPO train two steps on the tiny model with their sampling temperature acting (issue 21): the per-token
temperatures reach the rollout's metrics, EAD's truncated IS weights the loss, HAPO's clip bounds and advantage
factors leave their constants."""

import math

import pytest

from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.num_generations=2"]


@pytest.mark.long  # the method's plain two-step run is in test_methods_run; this one checks its mechanism
def test_ead_anneals_within_completions_and_corrects_with_tis(tiny_cfg):
    # 12 tokens, warm-up 1, d_0 = 8: τ/T runs 1 → 1.07 (t = 1) → τ_min from t ≈ 6
    result = run(
        tiny_cfg(
            *VARYING,
            *FAST,
            "trainer.max_new_tokens=12",
            "algorithm=ead",
            "algorithm.sampling_temperature.decay=8",
            "algorithm.sampling_temperature.warmup=1",
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    T = 0.7  # the tiny config's trainer.temperature
    assert m["ead/temperature_max"] > T and m["ead/temperature_min"] < T  # hotter early, cooler late
    assert m["ead/temperature_first"] == pytest.approx(T)  # the warm-up token at the base temperature
    assert m["ead/temperature_last"] < m["ead/temperature_max"]
    assert m["ead/decay"] == 8 + 5 * 2  # d_0 + growth · step at step 2
    assert 0 < m["rollout_correction/weight_mean"] and m["rollout_correction/weight_mean"] != 1.0
    assert m["mismatch/log_ratio_abs"] > 0  # the sampler is not the policy


@pytest.mark.long  # the plain two-step run is in test_methods_run; this one checks the mechanism
def test_hapo_adapts_temperature_clip_and_advantages(tiny_cfg):
    result = run(tiny_cfg(*VARYING, *FAST, "trainer.max_new_tokens=8", "algorithm=hapo"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    T = 0.7
    # step 2 samples with step 1's entropy statistics: temperatures spread around T within ±5 %
    assert T * 0.95 - 1e-6 <= m["hapo/temperature_min"] < m["hapo/temperature_max"] <= T * 1.05 + 1e-6
    assert m["hapo/clip_low"] > 0.2 and m["hapo/clip_high"] > 0.2  # widened at confident / uncertain tokens
    assert m["hapo/advantage_factor"] != 1.0
    assert 0 < m["hapo/high_entropy_frac"] < 1
    assert "hapo/fallback_group_frac" in m


def test_bad_settings_name_the_key():
    from rlexp.algorithms.advantages.group import grpo
    from rlexp.algorithms.algorithm import Algorithm
    from rlexp.algorithms.losses.clip import ppo_clip
    from rlexp.rollout.temperature import build_token_temperature

    with pytest.raises(ValueError, match="algorithm.sampling_temperature.schedule"):
        Algorithm("x", grpo, ppo_clip, sampling_temperature={"schedule": "linear"})
    with pytest.raises(ValueError, match="algorithm.rollout_correction: unknown"):
        Algorithm("x", grpo, ppo_clip, rollout_correction={"mode": "token_truncate", "cap": 2.0})
    with pytest.raises(ValueError, match="algorithm.rollout_correction.mode"):
        Algorithm("x", grpo, ppo_clip, rollout_correction={"mode": "truncate"})
    algo = Algorithm("x", grpo, ppo_clip, sampling_temperature={"schedule": "annealed", "decay": 8.0})
    assert build_token_temperature(algo.sampling_temperature).decay0 == 8.0  # what the trainer hands the rollout
    with pytest.raises(ValueError, match="algorithm.sampling_temperature: unknown setting"):
        build_token_temperature({"schedule": "entropy", "decay": 8.0}, "algorithm.sampling_temperature")


def test_hapo_sampler_statistics_survive_a_resume(tiny_cfg):
    over = [*VARYING, *FAST, "trainer.max_new_tokens=6", "algorithm=hapo"]
    first = run(tiny_cfg(*over, "trainer.max_steps=1")).metrics
    assert first["hapo/temperature_min"] == pytest.approx(first["hapo/temperature_max"])  # step 1: T everywhere
    resumed = run(tiny_cfg(*over, "trainer.max_steps=2"))  # the same run directory: resumes after step 1
    m = resumed.metrics
    assert resumed.last_step == 2 and m["hapo/temperature_min"] < m["hapo/temperature_max"]  # step 1's statistics
