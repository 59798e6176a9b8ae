"""Single-turn tasks as episodes (rlexp/environments/reasoning_gym.py): a reasoning-gym chain_sum record answered in
one turn — the task's own scorer is the turn's reward, the episode is done after it — and a multi-turn rollout of
such episodes (one turn each, never the turn limit), and a two-step tiny run through the episode machinery (long)."""

from __future__ import annotations

import math

import pytest

from rlexp.data.sources import reasoning_gym_task
from rlexp.environments.reasoning_gym import SingleTurnTask
from rlexp.rollout.multi_turn import MultiTurnRollout
from tests.rollout.test_multi_turn import MODEL, Scripted


@pytest.fixture(scope="module")
def task():
    record = reasoning_gym_task("chain_sum", seed=0, train_size=3, eval_size=1).train[0]
    # 6 - 7 - 9 + 0 + 3 - 7 = -14
    assert record["question"].endswith("6 - 7 - 9 + 0 + 3 - 7 =") and record["answer"] == "-14"
    return record


def test_the_tasks_scorer_is_the_turns_reward(task):
    env = SingleTurnTask()
    episode = env(task)
    assert episode.reset() is None  # the prompt is the question
    step = episode.step("6 - 7 = -1, -1 - 9 = -10, -10 + 3 = -7, -7 - 7 = -14\n#### -14")
    assert (step.observation, step.reward, step.done) == (None, 1.0, True)
    assert step.info == {"answered": 1, "correct": 1}
    with pytest.raises(RuntimeError, match="after its answer"):
        episode.step("#### -14")
    wrong = env(task)
    wrong.reset()
    assert (wrong.step("#### 14").reward, wrong.done) == (0.0, True)


def test_the_answer_is_read_as_the_accuracy_reward_reads_it(task):
    # no '#### ': the last number stands in (fallback_last_number, as reward=accuracy), unless it is off
    assert SingleTurnTask()(task).step("so it is -14").reward == 1.0
    strict = SingleTurnTask(fallback_last_number=False)(task).step("so it is -14")
    assert (strict.reward, strict.info) == (0.0, {"answered": 0, "correct": 0})
    assert SingleTurnTask(answer_format="boxed")(task).step("\\boxed{-14}").reward == 1.0
    with pytest.raises(ValueError, match="environment.answer_format='xml'"):
        SingleTurnTask(answer_format="xml")
    with pytest.raises(ValueError, match="dataset=reasoning_gym"):
        SingleTurnTask()({"id": "x"})


def test_a_rollout_of_single_turn_episodes(task, tiny):
    rollout = MultiTurnRollout(Scripted([["#### -14", "#### 3"]]), SingleTurnTask(), max_turns=4)
    out = rollout.generate(MODEL, tiny.tokenizer, ["P"], num_generations=2, records=[task])
    right, wrong = out.episodes
    assert (right["turns"], right["rewards"], right["correct"]) == (1, [1.0], 1)
    assert (wrong["turns"], wrong["rewards"], wrong["correct"]) == (1, [0.0], 0)
    assert not right["turn_limit"] and not right["truncated"]
    assert out.stats["episode/turns"] == 1.0 and out.stats["episode/env_reward"] == 0.5


@pytest.mark.long  # two steps of eight one-turn episodes (sampled, closed by a scripted EOS): ~8 s quiet
def test_single_turn_tasks_run_through_the_episode_machinery(tiny_cfg):
    from rlexp.runs.training import run

    result = run(
        tiny_cfg(
            "rollout=multi_turn",
            "environment=reasoning_gym",
            "dataset=reasoning_gym",
            "dataset.task=chain_sum",
            "reward=accuracy",
            "rollout.engine._target_=tests.environments.game_engine.GameEngine",
            "trainer.max_new_tokens=40",
            "rollout.max_turns=3",
            "trainer.autocast=off",
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    # one turn each (the scripted first command is no answer: score 0), done after it, never the turn limit
    assert m["episode/turns"] == 1.0 and m["episode/turn_limit_frac"] == 0.0 and m["episode/truncated_frac"] == 0.0
    assert m["episode/env_reward"] == 0.0 == m["reward/accuracy/mean"]
