"""TAPO, Tool-Augmented Policy Optimization (conf/algorithm/tapo_tool.yaml): DAPO's parts with the released code's
settings over multi-turn tool episodes. Its parts as configured, and two training steps on the tiny model with the
real Python tool (tests/rollout/summary_engine.py's FirstCall scripts the random model's first call): the tool runs, its
output is in the episode but out of the loss, and DAPO's stages act."""

from __future__ import annotations

import math

import pytest
from hydra.utils import instantiate

from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

# multi-turn episodes with a scripted first call: the overrides test_methods_run.py needs for algorithm=tapo_tool
MULTI_TURN = [
    "rollout=multi_turn",
    "environment=tool_use",
    "tools=[python]",
    "prompt=python_tool",
    "rollout.engine._target_=tests.rollout.summary_engine.FirstCall",
    "trainer.max_new_tokens=80",
    "rollout.max_turn_tokens=12",
    "rollout.max_turns=3",
]


def test_tapo_tool_is_dapo_with_the_released_settings(tiny_cfg):
    cfg = tiny_cfg("algorithm=tapo_tool", *MULTI_TURN)
    algo = instantiate(cfg.algorithm, _convert_="all")
    assert algo.name == "tapo_tool" and algo.family == "agentic" and algo.steps_per_rollout == 4
    assert algo.aggregation == "token-mean" and algo.kl.coef == 0.0
    assert (algo.loss.keywords["eps_low"], algo.loss.keywords["eps_high"], algo.loss.keywords["dual_clip"]) == (
        0.2,
        0.28,
        10.0,
    )
    stages = [s.func.__name__ for s in algo.group_stages]
    assert stages == ["dynamic_sampling", "overlong_penalty"]
    assert algo.group_stages[1].keywords["cache_fraction"] == 0.5 and algo.group_stages[1].keywords["max_length"] == 80


@pytest.mark.long  # ~20 s quiet: two steps of 3-turn episodes with the sandboxed tool, 4 optimiser steps each
def test_tapo_tool_trains_two_steps_with_the_python_tool(tiny_cfg):
    result = run(tiny_cfg("algorithm=tapo_tool", *MULTI_TURN, *VARYING, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["episode/tool_calls"] >= 1.0 and m["episode/tool_errors"] == 0.0  # the tool ran
    assert m["episode/policy_tokens"] < m["episode/length"]  # its output is in the episode, out of the loss
    assert m["dynamic_sampling/varied_frac"] > 0.0 and "dynamic_sampling/rounds" in m
    assert math.isfinite(m["reward/overlong/mean"]) and m["reward/overlong/mean"] <= 0.0
    assert math.isfinite(m["clip/high_frac"])
