"""AT-GRPO (algorithm=at_grpo with rollout=turn_groups): two training steps of the tiny model on real environments —
tool use with the sandboxed Python tool (a scripted first call, the random model's own second turn) and TextWorld
games (a scripted first command) — and its config-time checks."""

from __future__ import annotations

import math

import pytest

from rlexp.runs.training import run
from tests.algorithms.test_igpo import MULTI_TURN
from tests.algorithms.varying_reward import VARYING

# the overrides test_methods_run.py needs for algorithm=at_grpo: IGPO's multi-turn tool-use episodes under the tree
# rollout, G = K x max_turns = 2 x 3 (after FAST's trainer.num_generations=2); without the prompt's few-shot
# exchanges, whose tool message would make the scripted engine think the first turn is a later one
NO_EXAMPLES = ["prompt.examples=[]"]
AT_GRPO = [
    "rollout=turn_groups",
    *(o for o in MULTI_TURN if o != "rollout=multi_turn"),
    *NO_EXAMPLES,
    "trainer.num_generations=6",
]


@pytest.mark.long  # ~15 s quiet: two steps of two 3-turn trees of 2 candidates, the sandboxed tool
def test_at_grpo_trains_two_steps_on_tool_use(tiny_cfg):
    result = run(tiny_cfg(*VARYING, "algorithm=at_grpo", *AT_GRPO, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # turn 0: both candidates are the scripted call (the tool runs), tied -> the first continues; turn 1: the random
    # model's two candidates, cut at 12 tokens, end the episode; turn 2 is never reached (a third of the rows)
    assert m["episode/tool_calls"] == 1.0 and m["episode/turns"] == 2.0
    assert m["turn_groups/empty_frac"] == pytest.approx(1 / 3) and m["turn_groups/candidates"] == 2.0
    assert m["at_grpo/turn_groups"] == 4.0 and m["at_grpo/group_size_mean"] == 2.0  # 2 prompts x 2 turns
    # the tied turn-0 groups carry no signal; the sampled turn-1 candidates' vowel shares differ
    assert m["at_grpo/varied_frac"] == 0.5 and m["at_grpo/adv_abs_mean"] > 0
    assert m["turn_groups/select_gain"] > 0 and m["advantage/abs_mean"] > 0


@pytest.mark.long  # TextWorld game processes for 2 x 2 candidates and their replays: ~15 s quiet
def test_at_grpo_picks_the_winning_command_on_textworld_games(tiny_cfg):
    from tests.environments.test_text_games_run import textworld_run

    pytest.importorskip("textworld")
    runs = textworld_run("algorithm=at_grpo", *NO_EXAMPLES)  # the scripted engine counts assistant turns
    overrides = [o if o != "rollout=multi_turn" else "rollout=turn_groups" for o in runs]
    result = run(tiny_cfg(*overrides))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # G = 4 = 2 candidates x 2 turns; turn 0's candidates are "take coin" (wins) and "look": the run's reward (won)
    # picks "take coin", the game ends, turn 1's two rows stay empty. Each turn-0 group {1, 0} -> ±0.7071
    assert m["turn_groups/select_score"] == 1.0 and m["turn_groups/select_gain"] == 0.5
    assert m["turn_groups/empty_frac"] == 0.5 and m["episode/turns"] == 1.0 and m["reward/game/won"] == 0.25
    assert m["at_grpo/turn_groups"] == 2.0 and m["at_grpo/varied_frac"] == 1.0
    assert m["at_grpo/adv_abs_mean"] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), rel=1e-5)


def test_at_grpo_refuses_a_rollout_without_turn_groups_at_config_time(tiny_cfg):
    from rlexp.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match=r"agent_turn_groups\) reads turn-wise candidate groups: run it with"):
        validate(tiny_cfg("algorithm=at_grpo", *MULTI_TURN))
    with pytest.raises(ConfigError, match="rollout=turn_groups needs an environment"):
        validate(tiny_cfg("algorithm=at_grpo", "rollout=turn_groups"))
    with pytest.raises(ConfigError, match=r"trainer.num_generations=4 must be rollout.candidates \(K >= 2, got None\)"):
        validate(tiny_cfg("algorithm=at_grpo", *AT_GRPO[:-1]))  # G = 4 is not K x 3
    validate(tiny_cfg("algorithm=at_grpo", *AT_GRPO))
