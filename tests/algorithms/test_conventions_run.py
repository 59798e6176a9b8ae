"""The peer-convention settings (rlexp/algorithms/CONVENTIONS.md) in a training run: two steps on the tiny model
with the other peer's side switched on, each showing in the step's metrics where it has one."""

import math

from rlexp.runs.training import run
from tests.algorithms.test_methods_run import FAST
from tests.algorithms.varying_reward import SOMETIMES_NONE, VARYING


def test_verl_side_trains(tiny_cfg):
    """verl's raw singleton reward, token-count guard, log-ratio clamp, k3 clamps and dual clip (its clip fraction
    logged as clip/dual_frac), with TRL's KL bias correction, over μ = 2 epochs so the ratio moves off 1."""
    result = run(
        tiny_cfg(
            *VARYING,
            *FAST,
            "algorithm=grpo",
            "trainer.num_iterations=2",
            "algorithm.advantage.singleton=raw",
            "algorithm.token_count_guard=eps",
            "algorithm.loss.log_ratio_clamp=20.0",
            "algorithm.loss.dual_clip=3.0",
            "algorithm.kl.coef=0.04",
            "algorithm.kl.clamp=true",
            "algorithm.kl.bias_correction=true",
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert "clip/dual_frac" in m and "kl/mean" in m
    assert (
        0 <= m["clip/low_seq_min"] <= m["clip/low_frac"] + 1e-6 and m["clip/high_seq_max"] >= m["clip/high_frac"] - 1e-6
    )


def test_unscored_rows_left_out_in_a_run(tiny_cfg):
    """A TRL-style reward function returning None for some completions: the rows are counted in reward/unscored
    and, with unscored_rows=exclude, get advantage 0 (the run's advantage statistics come from the rest)."""
    result = run(tiny_cfg(*SOMETIMES_NONE, *FAST, "trainer.num_generations=4", "algorithm.unscored_rows=exclude"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert 0 < m["reward/unscored"] < 8


def test_gae_run_with_the_kl_penalty_per_token(tiny_cfg):
    """PPO's GAE with the KL penalty in the reward, charged per token (its token rewards)."""
    ppo = run(tiny_cfg(*VARYING, *FAST, "algorithm=ppo", "algorithm.kl.coef=0.05", "algorithm.kl.mode=reward"))
    assert ppo.last_step == 2 and ppo.metrics["kl/reward_penalty_mean"] != 0


def test_cispo_run_logs_verls_clip_fraction(tiny_cfg):
    cispo = run(tiny_cfg(*VARYING, *FAST, "algorithm=cispo", "algorithm.loss.log_ratio_clamp=20.0"))
    assert cispo.last_step == 2 and "clip/bound_frac" in cispo.metrics
