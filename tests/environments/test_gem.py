"""GEM's games as an environment (rlexp/environments/gem.py, rlexp/data/gem.py; gem-llm installed with --no-deps):
real episodes of GEM's own game code — Guess The Number won, a readable but illegal guess, an unreadable move that
ends the game, the 2x2 sliding puzzle solved by hand — the trainer's random streams untouched, the dataset's
records, the factory's checks, a scripted multi-turn rollout; and a two-step tiny run (long)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rlexp.data.reasoning_gym_compat import import_reasoning_gym

import_reasoning_gym()  # GEM imports reasoning-gym: with pycosat's stand-in where pycosat is absent
pytest.importorskip("gem")

from rlexp.data.gem import gem_games  # noqa: E402
from rlexp.environments.gem import GemGames  # noqa: E402
from rlexp.rollout.multi_turn import MultiTurnRollout  # noqa: E402
from tests.rollout.test_multi_turn import MODEL, Scripted  # noqa: E402

GUESS = "game:GuessTheNumber-v0-easy"  # a secret in 1..10, 4 turns


@pytest.fixture(scope="module")
def guess():
    return gem_games(seed=0, env_id=GUESS, train_size=2, eval_size=1)


def test_records_are_game_instances(guess):
    r0, r1 = guess.train
    assert [r["id"] for r in guess.train + guess.eval] == [f"gem-game-GuessTheNumber-v0-easy-{i}" for i in range(3)]
    assert r0["metadata"] == {
        "env_id": GUESS,
        "options": {},
        "game_seed": 0,  # game_seed(0, 0)
        "max_score": 1.0,
        "source_dataset": "gem",
    }
    assert [r["metadata"]["game_seed"] for r in guess.train + guess.eval] == [0, 1, 2]  # held out: a third seed
    q = r0["question"]
    assert q.startswith("You are playing Guess The Number.\nYou have to guess the number between 1 and 10")
    assert "within 4 turns" in q and q.endswith("Enter your first guess to start the game.\nEnter your next guess.")
    assert r0["scorer"] == "gem" and r0["answer"] == ""


def test_guess_the_number_is_won(guess):
    # seed 0: GEM seeds Python's random with 0, then draws the secret: random.seed(0); randint(1, 10) = 7
    random.seed(0)
    assert random.randint(1, 10) == 7
    episode = GemGames()(guess.train[0])
    assert episode.reset() is None  # the question shows the opening
    first = episode.step("Let me start in the middle: \\boxed{5}")
    assert (
        first.observation == "At turn 1, you guessed 5, and the target number is higher than 5.\nEnter your next guess."
    )
    assert (first.reward, first.done, first.info) == (0.0, False, {"won": 0, "lost": 0, "invalid_commands": 0})
    # a readable but illegal guess: GEM answers it, pays 0 and goes on (not a format error)
    illegal = episode.step("\\boxed{11}")
    assert illegal.observation.startswith("At turn 2, you guessed 11, which is outside the range specified.")
    assert (illegal.reward, illegal.done, illegal.info["invalid_commands"]) == (0.0, False, 0)
    last = episode.step("\\boxed{6} no wait, \\boxed{7}")  # GEM reads the last box
    assert last.observation == "Congratulations! You guessed the correct number 7 in 3 turns."
    assert (last.reward, last.done, last.info) == (1.0, True, {"won": 1, "lost": 0, "invalid_commands": 0})
    with pytest.raises(RuntimeError, match="after the game ended"):
        episode.step("\\boxed{7}")


def test_an_unreadable_move_ends_the_game(guess):
    episode = GemGames()(guess.train[0])
    episode.reset()
    step = episode.step("seven")  # no \boxed{...}: GEM's format error, -0.1, and the game ends
    assert step.observation == "At turn 1, you did not provide a valid guess."
    assert (step.reward, step.done, step.info) == (-0.1, True, {"won": 0, "lost": 1, "invalid_commands": 1})


def test_the_sliding_puzzle_solved_by_hand():
    # FifteenPuzzle easy (2x2), seed 0 opens on  3 1 / 2 __ ; "right" slides 2 right (3 1 / __ 2), "down" slides
    # 3 down (__ 1 / 3 2), "left" slides 1 left (1 __ / 3 2), "up" slides 2 up (1 2 / 3 __): solved
    puzzle = gem_games(seed=0, env_id="game:FifteenPuzzle-v0-easy", train_size=1, eval_size=1).train[0]
    assert puzzle["question"].endswith("Here is the current board layout: \n 3  1\n 2 __\n\nEnter your move.")
    episode = GemGames(env_id="game:FifteenPuzzle-v0-easy")(puzzle)
    episode.reset()
    steps = [episode.step(f"\\boxed{{{m}}}") for m in ("right", "down", "left")]
    assert [s.reward for s in steps] == [0.0, 0.0, 0.0] and not any(s.done for s in steps)
    # each observation ends with the board GEM shows next (its info["suffix"])
    assert steps[0].observation == (
        "At turn 1, you made a valid move: right.\nHere is the current board layout: \n 3  1\n__  2\n\nEnter your move."
    )
    assert steps[2].observation.endswith("\n 1 __\n 3  2\n\nEnter your move.")
    last = episode.step("\\boxed{up}")
    assert last.observation == "Congratulations! You have solved the puzzle!"
    assert (last.reward, last.done, last.info["won"]) == (1.0, True, 1)


def test_the_trainers_random_streams_are_untouched(guess):
    # GEM's reset seeds Python's and numpy's global generators; the episode swaps its own state in around each call
    random.seed(123)
    np.random.seed(123)
    expected = random.random(), np.random.random()
    random.seed(123)
    np.random.seed(123)
    episode = GemGames()(guess.train[1])
    episode.reset()
    episode.step("\\boxed{3}")
    assert (random.random(), np.random.random()) == expected


def test_checks_name_the_key(guess):
    with pytest.raises(ValueError, match=r"environment.env_id='game:Guess-v0' is not a GEM environment"):
        GemGames(env_id="game:Guess-v0")
    with pytest.raises(ValueError, match=r"environment.options: \['max_turn'\] not settings of .*max_turns"):
        GemGames(options={"max_turn": 3})  # GEM's games would swallow it silently
    with pytest.raises(ValueError, match="use dataset=gem"):
        GemGames()({"id": "q1", "question": "2 + 2?"})
    moved = {**guess.train[0], "question": "Guess!"}  # a record whose question is not its game's opening
    with pytest.raises(ValueError, match="opens differently"):
        GemGames()(moved).reset()


def test_a_rollout_plays_gem_turns(guess, tiny):
    # two episodes of game 0 (secret 7): one guesses 5 then 7 (won at turn 2), one writes no box (ended at turn 1)
    rollout = MultiTurnRollout(Scripted([["\\boxed{5}", "no idea"], ["\\boxed{7}"]]), GemGames(), max_turns=3)
    out = rollout.generate(MODEL, tiny.tokenizer, ["P"], num_generations=2, records=[guess.train[0]])
    won, lost = out.episodes
    assert (won["turns"], won["rewards"], won["won"], won["lost"]) == (2, [0.0, 1.0], 1, 0)
    assert (lost["turns"], lost["rewards"], lost["invalid_commands"], lost["lost"]) == (1, [-0.1], 1, 1)
    assert not won["turn_limit"] and not lost["turn_limit"]
    assert out.texts == ["\\boxed{5}\n\\boxed{7}", "no idea"]  # the policy's turns only


GUESS_RUN = [
    "rollout=multi_turn",
    "environment=gem",
    "dataset=gem",
    "reward=text_game",
    "prompt=gem",
    # Guess The Number over 1-2 in 2 turns: the scripted first guesses 1 and 2 win one of each pair
    "environment.options={min_number: 1, max_number: 2, max_turns: 2}",
    "dataset.train_size=4",
    "dataset.eval_size=1",
    "rollout.engine._target_=tests.environments.move_engine.GuessEngine",
    "trainer.max_new_tokens=80",
    "rollout.max_turn_tokens=8",
    "rollout.max_turns=2",
    "trainer.autocast=off",
]


@pytest.mark.long  # two steps of eight 1-2 turn episodes on the tiny model: ~15 s quiet
def test_grpo_plays_gem_games_two_steps(tiny_cfg):
    from rlexp.runs.training import run

    result = run(tiny_cfg(*GUESS_RUN))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    # per group of 4: the two right first guesses win at turn 1 (reward 1); the two wrong ones hear "higher" or
    # "lower", then the model's own junk (no box) is GEM's format error at turn 2 (-0.1, the game ends)
    assert m["episode/turns"] == 1.5 and m["episode/turn_limit_frac"] == 0.0
    assert m["reward/game/won"] == 0.5 and m["reward/game/lost"] == 0.5
    assert m["episode/env_reward"] == pytest.approx((1 - 0.1) / 2)
    assert m["reward/game/score"] == pytest.approx((1 - 0.1) / 2)  # over max_score 1
    assert m["reward/game/invalid_frac"] == pytest.approx(2 / 6)  # 2 unreadable moves of the 6 played
    assert m["episode/policy_tokens"] < m["episode/length"]  # the game's answers are in the episode, not the loss
    assert m["advantage/abs_mean"] > 0
