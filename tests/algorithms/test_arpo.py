"""ARPO (conf/algorithm/arpo.yaml with rollout=arpo, rlexp/rollout/branching.py) trains two steps on the tiny model in
multi-turn episodes with the real Python tool: each global episode's first turn is a scripted call (tests/rollout/
first_call_engine.py), the tool runs, and the turn after its result is scored for entropy; branches copy the call and
its result and sample that turn afresh."""

from __future__ import annotations

import math

import pytest

from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

# the overrides test_methods_run.py needs for algorithm=arpo: the branching rollout over multi-turn tool use, a
# scripted first call; alpha = 1, beta = 0 so that every turn after a tool's result branches while the group has
# room (the tiny random model's entropy rises are noise, and its 12-token second turns sum fewer entropies than the
# 20 of the scripted call: ΔH ≈ −8). Not prompt=python_tool: its worked examples hold a tool message, which
# FirstCallEngine takes for a later turn, so it would never script the call
ARPO_TINY = [
    "rollout=arpo",
    "environment=tool_use",
    "tools=[python]",
    "rollout.engine._target_=tests.rollout.first_call_engine.FirstCallEngine",
    "trainer.max_new_tokens=80",
    "rollout.max_turn_tokens=12",
    "rollout.max_turns=3",
    "rollout.alpha=1.0",
    "rollout.beta=0.0",
]


def test_arpo_refuses_a_rollout_without_branches_at_config_time(tiny_cfg):
    from rlexp.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match=r"algorithm.advantage \(arpo\) reads ARPO's branched episodes: run it with"):
        validate(tiny_cfg("algorithm=arpo"))
    with pytest.raises(ConfigError, match=r"algorithm.advantage \(arpo\) reads ARPO's branched episodes"):
        validate(tiny_cfg("algorithm=arpo", "rollout=multi_turn", *ARPO_TINY[1:-2]))  # episodes without trees
    with pytest.raises(ConfigError, match=r"rollout=arpo needs an environment"):
        validate(tiny_cfg("algorithm=arpo", "rollout=arpo"))
    validate(tiny_cfg("algorithm=arpo", *ARPO_TINY))
    validate(tiny_cfg("algorithm=gigpo", *ARPO_TINY))  # the branching rollout's episodes serve the episode parts


@pytest.mark.long  # ~20 s quiet: two steps of four 3-turn episodes (two branched), the sandboxed tool, entropy forwards
def test_arpo_trains_two_steps_with_branches_after_the_tools_result(tiny_cfg):
    result = run(tiny_cfg("algorithm=arpo", *ARPO_TINY, *VARYING, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["episode/tool_calls"] == 1.0 and m["episode/tool_errors"] == 0.0  # every row holds the call's result
    assert m["arpo/branches"] == 2.0 and m["arpo/branch_frac"] == 0.5  # G = 4, M = 2: one branch per global episode
    assert m["arpo/branched_rows_frac"] == 0.5 and m["arpo/shared_token_frac"] > 0.0
    assert m["arpo/branch_points"] == 2.0 and m["arpo/branch_prob_mean"] == 1.0 and m["arpo/refills"] == 0.0
    assert m["arpo/initial_entropy_mean"] > 0.0 and math.isfinite(m["arpo/entropy_rise_mean"])
