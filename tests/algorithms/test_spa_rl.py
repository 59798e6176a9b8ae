"""SPA-RL (algorithm=spa_rl with rollout=multi_turn): two training steps of the tiny model on TextWorld games (a
scripted first command, the random model's junk second command) and on tool use (the overrides test_methods_run.py
needs), and its config-time check."""

from __future__ import annotations

import math

import pytest

from rlexp.runs.training import run
from tests.algorithms.test_at_grpo import NO_EXAMPLES
from tests.algorithms.test_igpo import MULTI_TURN
from tests.algorithms.varying_reward import VARYING

# the overrides test_methods_run.py needs for algorithm=spa_rl: IGPO's multi-turn tool-use episodes (without the
# prompt's few-shot exchanges: see test_at_grpo.py)
SPA_RL = [*MULTI_TURN, *NO_EXAMPLES]


@pytest.mark.long  # TextWorld game processes, 160-token episodes and the turn-end forwards: ~15 s quiet
def test_spa_rl_attributes_progress_on_textworld_games(tiny_cfg):
    from tests.environments.test_text_games_run import textworld_run

    pytest.importorskip("textworld")
    result = run(tiny_cfg(*textworld_run("algorithm=spa_rl", *NO_EXAMPLES)))  # the scripted engine counts turns
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # per group of 4: two episodes win at turn 1 ("take coin"), two play "look" then a junk command (not admissible):
    # 6 turns, 4 of them grounded
    assert m["spa/grounding_mean"] == pytest.approx(2 / 3) and m["advantage/turns_mean"] == 1.5
    # the head was fitted on this step's and the last step's episodes: it fits them better than before the fit
    assert 0 < m["spa/estimator_loss"] < m["spa/estimator_loss_before"]
    assert m["spa/contribution_std"] > 0 and m["spa/buffer_episodes"] == 16.0  # 8 episodes a step, two steps
    assert m["advantage/abs_mean"] > 0 and m["reward/game/won"] == 0.5


@pytest.mark.long  # ~15 s quiet: two steps of four 3-turn episodes, the sandboxed tool, the turn-end forwards
def test_spa_rl_trains_two_steps_on_tool_use(tiny_cfg):
    result = run(tiny_cfg(*VARYING, "algorithm=spa_rl", *SPA_RL, "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # each episode: the scripted call (runs: grounded), then the random model's turn cut at 12 tokens (never answered)
    assert m["spa/grounding_mean"] == 0.5 and m["advantage/turns_mean"] == 2.0
    assert m["spa/contribution_std"] > 0 and m["spa/estimator_loss"] < m["spa/estimator_loss_before"]
    assert m["advantage/abs_mean"] > 0


def test_spa_rl_refuses_a_single_turn_rollout_at_config_time(tiny_cfg):
    from rlexp.config.schema import EPISODE_PARTS, ConfigError, validate

    with pytest.raises(ConfigError, match=r"reads multi-turn episodes: run it with rollout=multi_turn"):
        validate(tiny_cfg("algorithm=spa_rl"))
    assert "rlexp.algorithms.group_stages.progress.ProgressAttribution" in EPISODE_PARTS  # the stage on its own too
    validate(tiny_cfg("algorithm=spa_rl", *SPA_RL))
