"""AT-GRPO's tree rollout (rlexp/rollout/turn_groups.py): K candidates per turn from the shared state, the best
continues, one row per (turn, candidate) — the rows' tokens, loss mask, episode records and slots, the selection
(environment reward, the run's reward terms, first), the replayed environment copies, the empty rows of turns never
reached, and the plain multi-turn episodes of evaluation. The policy's turns are scripted (``Scripted`` from
test_multi_turn.py); the environment is a small deterministic one that logs every action it is given."""

from __future__ import annotations

import pytest
import torch

from rlexp.environments import EnvStep
from rlexp.rewards.terms import RewardTerm
from rlexp.rollout.turn_groups import TurnGroupRollout, pick
from tests.rollout.test_multi_turn import LP, MODEL, Scripted


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny.tokenizer


class Corridor:
    """Each turn is one command: "good" pays 1, "bad" is an invalid command (pays 0), "end" ends the episode; the
    observation says how many commands were played. Every episode made (``made``) logs the actions it was given."""

    role = "user"

    def __init__(self):
        self.made = []

    def __call__(self, record):
        env = self

        class Ep:
            def __init__(self):
                self.actions = []
                env.made.append(self)

            def reset(self):
                return None

            def step(self, action):
                self.actions.append(action)
                done = action == "end"
                info = {"invalid_commands": int(action == "bad")}
                return EnvStep(None if done else f"seen {len(self.actions)}", float(action == "good"), done, info)

        return Ep()


def ids(tok, text, eos=True):
    return tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])


def test_k_candidates_per_turn_the_best_continues_one_row_each(tok):
    env = Corridor()
    # K = 2, T = 2 (G = 4): turn 0 "bad" | "good" -> env rewards [0, 1], "good" continues; turn 1 "end" | "good"
    r = TurnGroupRollout(Scripted([["bad", "good"], ["end", "good"]]), env, max_turns=2, select="environment")
    out = r.generate(MODEL, tok, ["P"], num_generations=4, records=[{}])
    good, bad, end = ids(tok, "good"), ids(tok, "bad"), ids(tok, "end")
    obs = ids(tok, "<|im_start|>user\nseen 1<|im_end|>\n<|im_start|>assistant\n", eos=False)
    obs = tok("\n", add_special_tokens=False)["input_ids"] + obs  # after the EOS: the newline, the user turn
    history = good + obs
    # rows, turn-major: (0, 0) "bad", (0, 1) "good", (1, 0) history + "end", (1, 1) history + "good"
    rows = [bad, good, history + end, history + good]
    for k, row in enumerate(rows):
        n = len(row)
        assert out.completion_ids[k, :n].tolist() == row and int(out.completion_mask[k].sum()) == n
    assert out.policy_tokens[2, : len(history) + len(end)].tolist() == [0.0] * len(history) + [1.0] * len(end)
    assert out.logprobs[3, : len(history) + len(good)].tolist() == [0.0] * len(history) + [LP] * len(good)
    assert out.texts == ["bad", "good", "good\nend", "good\ngood"]
    # the second turn's candidates both continued the chosen "good" and its observation
    assert r.engine.contexts[1][0] == r.engine.contexts[1][1] == tok.decode(ids(tok, "P", eos=False) + history)
    slots = [e["slot"] for e in out.episodes]
    assert [(s["turn"], s["candidate"], s["chosen"]) for s in slots] == [
        (0, 0, False),
        (0, 1, True),
        (1, 0, False),
        (1, 1, True),
    ]
    assert [s["done"] for s in slots] == [False, False, True, False]
    # each row's episode is the path's, then its candidate's
    e = out.episodes
    assert (e[0]["turns"], e[0]["rewards"], e[0]["invalid_commands"]) == (1, [0.0], 1)
    assert (e[2]["turns"], e[2]["rewards"], e[2]["reward"]) == (2, [1.0, 0.0], 1.0)
    assert e[3]["turn_limit"] and not e[2]["turn_limit"]  # "good" at the last turn did not end the game
    assert e[2]["turn_infos"] == [{"invalid_commands": 0}, {"invalid_commands": 0}]
    assert e[2]["turn_ends"] == [len(good) - 1, len(history) + len(end) - 1]
    # the candidate of turn 1 that was not the chosen turn-0 branch's env played a replay of "good" first
    assert sorted(ep.actions for ep in env.made) == [["bad"], ["good", "end"], ["good", "good"]]
    s = out.stats
    assert s["turn_groups/candidates"] == 2.0 and s["turn_groups/empty_frac"] == 0.0
    assert s["turn_groups/select_score"] == 1.0 and s["turn_groups/select_gain"] == 0.5  # max 1 vs mean 0.5
    assert s["turn_groups/varied_frac"] == 1.0
    assert s["episode/turns"] == 2.0 and s["episode/env_reward"] == 2.0 and s["episode/turn_limit_frac"] == 1.0


def test_turns_never_reached_are_empty_rows(tok):
    # "end" ties "bad" at 0 and comes first: the episode ends at turn 0, turn 1's two slots stay empty
    r = TurnGroupRollout(
        Scripted([["end", "bad"] * 2, ["end", "good"] * 2]), Corridor(), max_turns=2, select="environment"
    )
    out = r.generate(MODEL, tok, ["P", "Q"], num_generations=4, records=[{}, {}])
    assert out.completion_ids.shape[0] == 8 and out.completion_mask[[2, 3, 6, 7]].sum() == 0
    assert [e["slot"]["turn"] for e in out.episodes] == [0, 0, -1, -1] * 2 and out.texts[2] == ""
    assert out.episodes[2]["turns"] == 0 and out.stats["turn_groups/empty_frac"] == 0.5
    assert out.stats["episode/turns"] == 1.0 and len(r.engine.turns) == 1  # no second turn was sampled


class LengthTerm(RewardTerm):
    """Scores the row's last turn by its length: what ``select=reward`` reads through the bound terms."""

    def score(self, sample) -> float:
        return float(len(sample.completion.split("\n")[-1]))


def test_select_by_the_runs_reward_or_the_first(tok):
    # env rewards: "good" 1, "looong" 0; the reward term prefers the longer text
    turns = [["good", "looong"], ["end", "end"]]
    r = TurnGroupRollout(Scripted(turns), Corridor(), max_turns=2)
    r.bind_reward_terms({"len": LengthTerm(weight=0.5)})
    out = r.generate(MODEL, tok, ["P"], num_generations=4, records=[{}])
    assert [e["slot"]["chosen"] for e in out.episodes[:2]] == [False, True]
    assert out.stats["turn_groups/select_score"] == pytest.approx((0.5 * 6 + 0.5 * 3) / 2)  # 6 chars, then "end"
    first = TurnGroupRollout(Scripted(turns), Corridor(), max_turns=2, select="first")
    out = first.generate(MODEL, tok, ["P"], num_generations=4, records=[{}])
    assert [e["slot"]["chosen"] for e in out.episodes[:2]] == [True, False] and out.texts[2] == "good\nend"
    assert pick([0.0, 2.0, 2.0], "reward") == 1 and pick([3.0, 1.0], "first") == 0


def test_evaluation_rolls_out_plain_episodes_and_bad_settings_name_the_key(tok):
    r = TurnGroupRollout(Scripted([["end"]]), Corridor(), max_turns=2)
    out = r.generate(MODEL, tok, ["P"], num_generations=1, greedy=True, records=[{}])
    assert out.texts == ["end"] and "slot" not in out.episodes[0]
    with pytest.raises(ValueError, match=r"trainer.num_generations=5 must be rollout.candidates"):
        r.generate(MODEL, tok, ["P"], num_generations=5, records=[{}])
    with pytest.raises(ValueError, match="rollout.candidates must be >= 2"):
        TurnGroupRollout(Scripted([]), Corridor(), candidates=1)
    with pytest.raises(ValueError, match="rollout.select='best' is not one of"):
        TurnGroupRollout(Scripted([]), Corridor(), select="best")
    assert TurnGroupRollout(Scripted([]), Corridor(), max_turns=2, candidates=3).group_size(6) == 3
    assert torch.is_tensor(out.policy_tokens)
