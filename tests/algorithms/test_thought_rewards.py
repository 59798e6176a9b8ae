"""TP-GRPO (rlexp.algorithms.group_stages.thought_rewards, rlexp.algorithms.advantages.thought_process): thought units
by hand, the capability-adaptive thought rewards and the advantage's two propositions by hand (right thoughts of a
correct solution and matching thoughts of a wrong one keep the outcome advantage; wrong thoughts lose r_c = α·acc_G,
uncertain ones go to 0; a hard prompt falls back to the outcome), the stage placing thoughts at tokens on the tiny
tokenizer, its errors, and two training steps of algorithm=tp_grpo on the tiny model."""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import open_dict

from rlexp.algorithms.advantages.thought_process import tp_grpo
from rlexp.algorithms.group_stages.thought_rewards import THOUGHT_CORRECT, THOUGHT_LABELS, ThoughtUnits, thought_units
from rlexp.rewards.process import ProcessReward, token_positions
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING


def test_thought_units_by_hand():
    scores, ends = [0.9, 0.2, 0.1, 0.8, 0.3], [5, 10, 15, 20, 25]
    # correct: marks + − − + and the answer's step + → thoughts [s1] [s2 s3] [s4 s5]
    assert thought_units(scores, ends, correct=True) == ([5, 15, 25], [1, -1, 1])
    # wrong: the answer's step is − → [s1] [s2 s3] [s4] [s5]
    assert thought_units(scores, ends, correct=False) == ([5, 15, 20, 25], [1, -1, 1, -1])
    assert thought_units([0.1], [3], correct=True) == ([3], [1]) and thought_units([], [], True) == ([], [])


def _thought_batch():
    """Group 0: a correct row and a wrong one (rewards 1, 0); group 1: two correct rows (an easy prompt)."""
    b = make_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], lengths=[6, 6, 6, 4], width=6)
    labels = torch.zeros(4, 6)
    labels[0, 1], labels[0, 3] = 1.0, -1.0  # correct row: right thought (tokens 0-1), wrong (2-3), final (4-5)
    labels[1, 2], labels[1, 4] = -1.0, 1.0  # wrong row: matching (0-2), uncertain (3-4), final (5)
    labels[2, 1] = -1.0  # easy prompt: a wrong thought (0-1), then the final one
    b.extras[THOUGHT_LABELS] = labels
    b.extras[THOUGHT_CORRECT] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    return b


def test_tp_grpo_advantages_by_hand():
    b = _thought_batch()
    adv = tp_grpo(b, alpha=1.0)
    o = 0.5 / (math.sqrt(0.5) + 1e-6)  # group 0: rewards (1, 0) → ±0.70711
    # correct row, r_c = α·acc_G = 0.5: rewards +0.5 at token 1, −0.5 at token 3; sums to the end
    # → (0, 0, −0.5, −0.5, 0, 0): the right thought keeps r̂, the wrong one gets r̂ − r_c (proposition 1)
    torch.testing.assert_close(adv[0], torch.tensor([o, o, o - 0.5, o - 0.5, o, o]))
    # wrong row, r̂ = −0.70711: −label·r̂ → r̂ at token 2 (matching), −r̂ at token 4 (uncertain)
    # → sums (0, 0, 0, +0.70711, +0.70711, 0): matching keeps r̂, uncertain gets 0 (proposition 2)
    torch.testing.assert_close(adv[1], torch.tensor([-o, -o, -o, 0.0, 0.0, -o]))
    # group 1, all correct: r̂ = 0, acc_G = 1 → r_c = α = 1: the wrong thought gets −1, the rest 0; padding 0
    torch.testing.assert_close(adv[2], torch.tensor([-1.0, -1.0, 0.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(adv[3], torch.zeros(6))
    # metrics: |Â − r̂| summed over tokens: row 0: 2·0.5, row 1: 2·0.70711, row 2: 2·1 → over 22 valid tokens
    assert b.stats["tp_grpo/process_abs_mean"] == pytest.approx((1.0 + 2 * o + 2.0) / 22, abs=1e-5)
    assert b.stats["tp_grpo/r_c_mean"] == pytest.approx((0.5 + 1.0 + 1.0) / 3)
    # α = 2 doubles r_c only: the wrong row is untouched
    adv2 = tp_grpo(_thought_batch(), alpha=2.0)
    torch.testing.assert_close(adv2[0], torch.tensor([o, o, o - 1.0, o - 1.0, o, o]))
    torch.testing.assert_close(adv2[1], adv[1])


def test_a_hard_prompt_falls_back_to_the_outcome():
    # one correct row of four: acc_G = 0.25 → r_c = 0.25; α·acc_G → 0 as the prompt gets harder
    b = make_batch([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0], lengths=[4] * 4, width=4)
    labels = torch.zeros(4, 4)
    labels[0, 1] = -1.0
    b.extras[THOUGHT_LABELS], b.extras[THOUGHT_CORRECT] = labels, torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv = tp_grpo(b)
    o = 0.75 / (0.5 + 1e-6)  # rewards (1, 0, 0, 0): mean 0.25, std 0.5 → r̂ = 1.5 for the correct row
    torch.testing.assert_close(adv[0], torch.tensor([o - 0.25, o - 0.25, o, o]))


def test_tp_grpo_needs_the_stage_and_the_stage_needs_its_terms():
    with pytest.raises(ValueError, match="ThoughtUnits group stage"):
        tp_grpo(make_batch([1.0, 0.0], [0, 0]))
    with pytest.raises(ValueError, match="alpha=-1"):
        tp_grpo(_thought_batch(), alpha=-1)
    with pytest.raises(KeyError, match="ThoughtUnits.process_term='prm' is not a reward term"):
        ThoughtUnits()(make_batch([1.0, 0.0], [0, 0]), SimpleNamespace(reward_terms={}))


class WordScorer:
    """Step score 1 for a step of odd length, else 0."""

    def score_steps(self, question, steps):
        return [float(len(s) % 2) for s in steps]


def test_the_stage_places_thoughts_at_tokens(tiny):
    tok = tiny.tokenizer
    texts = ["ab\nabc\nabcde\nabcd", "abc\nab"]  # steps by line → scores (0, 1, 1, 0) and (1, 0)
    term = ProcessReward(weight=0.5, scorer=WordScorer(), split="lines")
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    b = make_batch(
        [0.0, 0.0],
        [0, 0],
        lengths=[len(i) for i in ids],
        width=width,
        terms=[[1.0, 0.0], [0.0, 1.0]],
        weights=[1.0, 0.5],
    )  # fmt: skip  t0: accuracy, t1: prm
    b.reward_names = ["accuracy", "prm"]
    for i, row in enumerate(ids):
        b.completion_ids[i, : len(row)] = torch.tensor(row)
    b.completions, b.prompts = texts, ["p", "p"]
    term([Sample("p", t, {"question": "q0"}, 0, 3, False) for t in texts])  # the reward stage caches the steps
    out = ThoughtUnits()(b, SimpleNamespace(reward_terms={"prm": term}, tokenizer=tok))
    # the process term left the reward: weight 0, the total is the accuracy alone
    assert out.reward_weights.tolist() == [1.0, 0.0] and out.reward.tolist() == [1.0, 0.0]
    # row 0, correct: marks − + + and the answer's + → thoughts [ab] [abc abcde abcd]: one mark, −1 after "ab"
    want = torch.zeros(2, width)
    want[0, token_positions(tok, ids[0], texts[0], [2])[0]] = -1.0
    # row 1, wrong: marks + and the answer's − → thoughts [abc] [ab]: +1 after "abc"
    want[1, token_positions(tok, ids[1], texts[1], [3])[0]] = 1.0
    torch.testing.assert_close(out.extras[THOUGHT_LABELS], want)
    assert out.extras[THOUGHT_CORRECT].tolist() == [1.0, 0.0]
    assert out.stats["tp_grpo/thoughts_mean"] == 2.0 and out.stats["tp_grpo/multi_thought_frac"] == 1.0
    assert out.stats["tp_grpo/wrong_thought_frac"] == 0.5
    # a term without step scores: one thought per row, nothing marked
    plain = make_batch([1.0, 0.0], [0, 0], terms=[[1.0, 0.3], [0.0, 0.6]])
    plain.reward_names = ["accuracy", "prm"]
    done = ThoughtUnits()(plain, SimpleNamespace(reward_terms={"prm": object()}, tokenizer=tok))
    assert float(done.extras[THOUGHT_LABELS].abs().sum()) == 0.0 and done.stats["tp_grpo/thoughts_mean"] == 1.0


class TinyStepScorer:
    """For the two-step run: a word-length parity verdict per step (the tiny model's words vary)."""

    def score_steps(self, question, steps):
        return [float(len(s.strip()) % 2) for s in steps]


@pytest.mark.long  # a two-step run (default suite budget)
def test_tp_grpo_trains_two_steps_on_the_tiny_model(tiny_cfg):
    cfg = tiny_cfg(
        *VARYING,
        "algorithm=tp_grpo",
        "algorithm.group_stages.0.correct_min=0.4",  # the vowel share counts as correct from 0.4
        "trainer.autocast=off",
        "trainer.max_new_tokens=12",
        "trainer.device=cpu",
    )
    with open_dict(cfg):
        cfg.reward.terms.prm = {
            "_target_": "rlexp.rewards.process.ProcessReward",
            "weight": 0.5,
            "scorer": {"_target_": "tests.algorithms.test_thought_rewards.TinyStepScorer"},
            "split": "tagged",
            "tag_pattern": r"\s+",  # every word a step
            "max_steps": 8,
        }
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert m["tp_grpo/multi_thought_frac"] > 0 and m["tp_grpo/thoughts_mean"] > 1.0
    assert m["tp_grpo/process_abs_mean"] > 0  # the thought rewards moved the advantages
