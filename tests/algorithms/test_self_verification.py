"""One policy as its own verifier, judge and referee (rlexp/algorithms/group_stages/self_verification.py): the verdict
parsers and rewards by hand, RISE's, SPARK's and URPO's stages on hand-made batches with scripted replies (every row
and reward worked out by hand), the settings' errors, then two training steps of each method on the tiny model
(conf/algorithm/rise.yaml, spark_coevolve.yaml, urpo.yaml; long suite), with the tiny model's own replies (which never
parse: the failures are counted) and with scripted verdicts (so the judgment rewards vary)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.self_verification import (
    BOX_PATTERN,
    BOXED_PATTERN,
    MALFORMED,
    MISSING,
    OUT_OF_RANGE,
    PAIRWISE_VERDICTS,
    PARSED,
    POINTWISE_VERDICTS,
    SCORES_PATTERN,
    RecycledJudging,
    SelfReferee,
    SelfVerification,
    outcome_class,
    parse_scores,
    read_verdict,
    referee_reward,
    share_count,
    spread,
    verification_reward,
)
from rlexp.core.batch import RolloutBatch
from rlexp.data.prompts import PromptFormat
from rlexp.rewards.answers import extract_answer
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import RewardTerm
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run
from tests.algorithms.comas_engine import scripted_output
from tests.algorithms.varying_reward import VARYING

# ---------------------------------------------------------------- parsing and rewards, by hand


def test_rise_verdicts_are_the_last_boxed_number_in_range():
    assert read_verdict("maybe \\boxed{-1} ... no: \\boxed{1}", BOXED_PATTERN, (-1, 1)) == (1.0, PARSED)
    assert read_verdict("\\boxed{ -0.5 }", BOXED_PATTERN, (-1, 1)) == (-0.5, PARSED)
    assert read_verdict("It is right.", BOXED_PATTERN, (-1, 1)) == (None, MISSING)
    assert read_verdict("\\boxed{yes}", BOXED_PATTERN, (-1, 1)) == (None, MALFORMED)
    assert read_verdict("\\boxed{3}", BOXED_PATTERN, (-1, 1)) == (None, MALFORMED)  # outside [-1, 1]


def test_rise_outcome_and_verification_reward():
    assert outcome_class(1.0, True, 0.5) == "correct" and outcome_class(0.7, False, 0.5) == "correct"
    assert outcome_class(0.0, True, 0.5) == "wrong" and outcome_class(0.0, False, 0.5) == "no_answer"
    rewards = (1.0, -0.5, -1.0)
    assert verification_reward(-0.5, PARSED, -0.5, rewards) == 1.0  # the verdict is r_o
    assert verification_reward(1.0, PARSED, -0.5, rewards) == -0.5  # another r_o
    assert verification_reward(None, MALFORMED, 1.0, rewards) == -0.5  # a boxed value that is no verdict
    assert verification_reward(None, MISSING, -1.0, rewards) == -1.0  # no \boxed{} at all, whatever the target


def test_spark_verdicts_read_box_or_boxed_words():
    assert read_verdict("Reasoning... \\box{Yes}", BOX_PATTERN, verdicts=POINTWISE_VERDICTS) == (1.0, PARSED)
    assert read_verdict("\\boxed{no}", BOX_PATTERN, verdicts=POINTWISE_VERDICTS) == (0.0, PARSED)
    assert read_verdict("\\boxed{B}", BOX_PATTERN, verdicts=PAIRWISE_VERDICTS) == (0.0, PARSED)
    assert read_verdict("\\boxed{A}", BOX_PATTERN, verdicts=POINTWISE_VERDICTS) == (None, MALFORMED)
    assert read_verdict("A is better", BOX_PATTERN, verdicts=PAIRWISE_VERDICTS) == (None, MISSING)


def test_urpo_scores_are_n_numbers_in_scale_normalised():
    # (7 − 1)/9 = 2/3, (1 − 1)/9 = 0, (10 − 1)/9 = 1; the last "Scores:" line counts
    s, st = parse_scores("Scores: 1, 1, 1\nOn reflection. Scores: 7, 1, 10", 3, SCORES_PATTERN, (1, 10))
    assert st == PARSED and s == pytest.approx([2 / 3, 0.0, 1.0])
    assert parse_scores("scores = [4; 4; 4]", 3, SCORES_PATTERN, (1, 10))[1] == PARSED
    assert parse_scores("Scores: 7, 1", 3, SCORES_PATTERN, (1, 10)) == (None, MALFORMED)
    assert parse_scores("Scores: 7, 1, 11", 3, SCORES_PATTERN, (1, 10)) == (None, OUT_OF_RANGE)
    assert parse_scores("All good.", 3, SCORES_PATTERN, (1, 10)) == (None, MISSING)


def test_referee_reward_by_hand():
    # absolute: 1 − (|2/3 − 1| + |1/3 − 0|)/2 = 2/3
    assert referee_reward([2 / 3, 1 / 3], [1.0, 0.0]) == pytest.approx(2 / 3)
    # pairwise: pairs (correct, wrong) = (0, 1), (0, 2): 0.9 > 0.2 won, 0.9 = 0.9 a tie -> (1 + 1/2)/2 = 3/4
    assert referee_reward([0.9, 0.2, 0.9], [1.0, 0.0, 0.0], "pairwise") == pytest.approx(0.75)
    # no pair with different labels: the absolute agreement, 1 − (0.5 + 0)/2
    assert referee_reward([0.5, 1.0], [1.0, 1.0], "pairwise") == pytest.approx(0.75)
    assert referee_reward([0.0], [2.0]) == 0.0  # labels clipped to [0, 1]


def test_spread_draws_rows_evenly_over_the_groups():
    import random

    rng = random.Random(0)
    picks = spread(5, [2, 4, 3], rng)  # 5 = 1 a group + 2 more in two of the three groups
    assert sorted(len(p) for p in picks) == [1, 2, 2] and all(p == sorted(set(p)) for p in picks)
    assert spread(10, [2, 1], rng) == [[0, 1], [0]]  # never more than a group has
    assert share_count(0.125, 2) == 0 and share_count(0.25, 2) == 1 and share_count(0.5, 5) == 3


# ---------------------------------------------------------------- hand-made batches, scripted replies

RECORDS = [
    {"id": "a", "question": "Problem A: 1 + 2?", "answer": "3"},
    {"id": "b", "question": "Problem B: 2 + 2?", "answer": "4"},
]


class Match(RewardTerm):
    """The test's rule verifier: 1 when the '#### <n>' answer is the record's (0 for a record without one)."""

    def score(self, sample) -> float:
        answer = sample.record.get("answer")
        return float(answer is not None and extract_answer(sample.completion, "hash") == answer)


class Scripted:
    """A rollout engine replying by ``reply(prompt)`` (a list: the prompt's replies in turn); ``calls`` logs
    (prompts, num_generations)."""

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def generate(self, model, tokenizer, prompts, num_generations=1, **_):
        self.calls.append((list(prompts), num_generations))
        replies, expanded = [], []
        for p in prompts:
            own = self.reply(p)
            replies += [own[k % len(own)] for k in range(num_generations)]
            expanded += [p] * num_generations
        return scripted_output(tokenizer, expanded, replies)


def _batch_and_ctx(tiny, completions, records, engine):
    fmt = PromptFormat(system_prompt="Solve it.", answer_format="hash", instruction="End with '#### <answer>'.")
    terms = {"accuracy": Match()}
    ctx = SimpleNamespace(
        policy=torch.nn.Linear(1, 1),
        tokenizer=tiny.tokenizer,
        rollout=engine,
        reward_terms=terms,
        prompt_format=fmt,
        answer_format="hash",
        autocast_dtype=None,
        step=1,
    )
    prompts = [fmt.render(tiny.tokenizer, r["question"]) for r in records]
    rows = [p for p in prompts for _ in range(2)]
    out = scripted_output(tiny.tokenizer, rows, completions)
    batch = RolloutBatch.from_generation(out, torch.tensor([0, 0, 1, 1]), rows, [r for r in records for _ in range(2)])
    score(batch, terms)
    batch.stats["time/reward_s"] = 0.0
    return batch, ctx


# RISE: A's solutions "#### 3" (correct: r_o = 1), "#### 5" (wrong: −0.5); B's "I do not know." (no answer: −1),
# "#### 4" (correct: 1). The verifier's scripted verdicts on each: 1 (a match), 1 (a mismatch), none (missing), "yes"
# (malformed).
RISE_SOLUTIONS = ["#### 3", "#### 5", "I do not know.", "#### 4"]
RISE_VERDICTS = {
    "#### 3": "Correct. \\boxed{1}",
    "#### 5": "Looks right. \\boxed{1}",
    "I do not know.": "No idea.",
    "#### 4": "\\boxed{yes}",
}


def _rise_reply(prompt):
    return [next(v for k, v in RISE_VERDICTS.items() if f"### Response Begin ###\n{k}\n" in prompt)]


def test_rise_verifies_every_solution_and_rewards_each_verdict(tiny):
    engine = Scripted(_rise_reply)
    batch, ctx = _batch_and_ctx(tiny, RISE_SOLUTIONS, RECORDS, engine)
    out = SelfVerification(verify_share=2.0, samples=2)(batch, ctx)  # 2 × 2 groups = every row; 2 replies each
    s = out.stats
    assert len(out) == 4 + 8 and out.completions[:4] == RISE_SOLUTIONS
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # one group per verification prompt
    # match 1, mismatch −0.5, missing −1, malformed −0.5 (x 2 replies); the solutions 0 in the new column
    expected = [0.0] * 4 + [1.0, 1.0, -0.5, -0.5, -1.0, -1.0, -0.5, -0.5]
    assert out.term("verification").tolist() == pytest.approx(expected)
    assert out.reward_names == ["accuracy", "verification"] and out.reward_weights.tolist() == [1.0, 1.0]
    assert out.term("accuracy").tolist() == [1.0, 0.0, 0.0, 1.0] + [0.0] * 8  # verifications are no answers
    assert out.reward.tolist() == pytest.approx([1.0, 0.0, 0.0, 1.0] + expected[4:])
    # each verification row under its own prompt: the problem, the solution, the system prompt, chat-templated
    assert "Problem B: 2 + 2?" in out.prompts[8] and "### Response Begin ###\nI do not know.\n" in out.prompts[8]
    assert out.prompts[8].count("Please reason step by step") == 1 and out.prompts[8] == out.prompts[9]
    ids = out.prompt_ids[8][out.prompt_mask[8].bool()].tolist()
    assert ids == ctx.tokenizer(out.prompts[8], add_special_tokens=False)["input_ids"]
    assert engine.calls[0][1] == 2 and len(engine.calls[0][0]) == 4
    # stats by hand: 2 of 8 replies give r_o; rewards (2 − 1 − 2 − 1)/8; failures 2 missing + 2 malformed
    assert s["rise/verify_prompts"] == 4.0 and s["rise/verify_rows"] == 8.0
    assert s["rise/verify_accuracy"] == pytest.approx(0.25) and s["rise/verify_reward_mean"] == pytest.approx(-0.25)
    assert s["rise/verify_parse_failures"] == 4.0 and s["rise/verify_parsed"] == 4.0
    assert s["rise/verify_missing"] == 2.0 and s["rise/verify_malformed"] == 2.0
    assert s["rise/verified_correct_frac"] == 0.5 and s["rise/solution_accuracy"] == 0.5
    assert s["rise/clipped_prompts"] == 0.0 and s["time/rise_generate_s"] >= 0.0 and "time/reward_s" in s


def test_rise_default_share_verifies_one_solution_a_step_with_g_replies(tiny):
    engine = Scripted(_rise_reply)
    batch, ctx = _batch_and_ctx(tiny, RISE_SOLUTIONS, RECORDS, engine)
    out = SelfVerification()(batch, ctx)  # 0.125 × 2 groups rounds to 0: at least one; G = 2 replies
    assert len(out) == 6 and out.stats["rise/verify_prompts"] == 1.0 and out.stats["rise/verify_rows"] == 2.0
    assert out.group_ids.tolist()[4:] == [2, 2] and out.prompts[4] == out.prompts[5]


# SPARK: A mixed ("#### 3" correct, "#### 5" wrong) -> a pairwise item (pointwise_prob 0); B all wrong ("#### 1", "I do
# not know.") -> a pointwise item on its one stated answer, "1" (label No). Reflections: A (the first half) on its
# wrong reasoning "#### 5", B on its wrong stated answer "1". Scripted: the judge always says A / No; A's reflection
# answers 3 (correct), B's 2 (wrong).
SPARK_SOLUTIONS = ["#### 3", "#### 5", "#### 1", "I do not know."]


def _spark_reply(prompt):
    if "<Judgement>:" in prompt:
        return ["I pick \\boxed{A}"] if "(A) " in prompt else ["Wrong. \\box{No}"]
    return ["#### 3"] if "Problem A" in prompt else ["#### 2"]


def test_spark_recycles_rollouts_into_judge_and_reflection_rows(tiny):
    engine = Scripted(_spark_reply)
    batch, ctx = _batch_and_ctx(tiny, SPARK_SOLUTIONS, RECORDS, engine)
    stage = RecycledJudging(pointwise_prob=0.0, judge_share=1.0, reflection_share=1.0, samples=2)
    out = stage(batch, ctx)
    s = out.stats
    assert len(out) == 4 + 4 + 4 and out.group_ids.tolist()[4:] == [2, 2, 3, 3, 4, 4, 5, 5]
    pair, point = out.prompts[4], out.prompts[6]
    assert "Problem A: 1 + 2?" in pair and ("(A) 3\n(B) 5" in pair or "(A) 5\n(B) 3" in pair)
    assert "Problem B: 2 + 2?" in point and "<Answer>:\n1\n" in point  # the stated answer, not the completion
    # the pairwise label is A when the correct answer is shown first; the pointwise label is No: both hit when A first
    pair_reward = 1.0 if "(A) 3\n" in pair else 0.0
    assert out.term("judge").tolist() == [0.0] * 4 + [pair_reward] * 2 + [1.0, 1.0] + [0.0] * 4
    # reflections: questions in the run's prompt format, scored by the run's verifier against the ground truth
    refl_a, refl_b = out.prompts[8], out.prompts[10]
    assert "Provided reasoning:\n#### 5" in refl_a and "Solve it." in refl_a and "End with '#### <answer>'." in refl_a
    assert "Answer:\n1" in refl_b and "Problem B: 2 + 2?" in refl_b
    assert out.completions[8:] == ["#### 3", "#### 3", "#### 2", "#### 2"]
    assert out.term("accuracy").tolist() == [1.0, 0.0, 0.0, 0.0] + [0.0] * 4 + [1.0, 1.0, 0.0, 0.0]
    assert s["spark/judge_items"] == 2.0 and s["spark/pairwise_items"] == 1.0 and s["spark/pointwise_items"] == 1.0
    assert s["spark/reflection_items"] == 2.0 and s["spark/judge_rows"] == 4.0 and s["spark/reflection_rows"] == 4.0
    assert s["spark/judge_accuracy"] == pytest.approx((2 * pair_reward + 2) / 4)
    assert s["spark/judge_parse_failures"] == 0.0 and s["spark/skipped_items"] == 0.0
    assert s["spark/reflection_accuracy"] == 0.5 and s["spark/solution_accuracy"] == 0.25
    # the judge replies were sampled 2 per item in one call; the reflections through the run's format
    assert engine.calls[0][1] == 2 and len(engine.calls[0][0]) == 2


def test_spark_skips_a_rollout_without_a_stated_answer_unless_judging_solutions(tiny):
    completions = ["#### 3", "#### 5", "I do not know.", "Nope."]  # B: all wrong, no answer stated
    batch, ctx = _batch_and_ctx(tiny, completions, RECORDS, Scripted(_spark_reply))
    out = RecycledJudging(pointwise_prob=0.0, judge_share=1.0, reflection_share=0.0, samples=1)(batch, ctx)
    assert out.stats["spark/judge_items"] == 1.0 and out.stats["spark/skipped_items"] == 1.0 and len(out) == 5
    batch, ctx = _batch_and_ctx(tiny, completions, RECORDS, Scripted(_spark_reply))
    stage = RecycledJudging(judge_on="solution", pointwise_prob=0.0, judge_share=1.0, reflection_share=0.0, samples=1)
    out = stage(batch, ctx)
    assert out.stats["spark/judge_items"] == 2.0 and out.stats["spark/skipped_items"] == 0.0 and len(out) == 6
    assert "<Answer>:\nI do not know.\n" in out.prompts[5] or "<Answer>:\nNope.\n" in out.prompts[5]


# URPO: A ("#### 3" correct, "#### 5" wrong) has a ground truth; B is an open-ended instruction (no answer). The
# referee's scripted replies to A: "Scores: 7, 4" (2/3, 1/3), then a malformed "Scores: 4"; to B: "Scores: 7, 1"
# (2/3, 0), "Scores: 10, 4" (1, 1/3).
URPO_RECORDS = [RECORDS[0], {"id": "c", "question": "Write a haiku about sums."}]


def _urpo_reply(prompt):
    return ["Scores: 7, 4", "Scores: 4"] if "Problem A" in prompt else ["Scores: 7, 1", "Scores: 10, 4"]


def test_urpo_trains_referee_rows_and_rewards_open_prompts_by_the_referee(tiny):
    engine = Scripted(_urpo_reply)
    batch, ctx = _batch_and_ctx(tiny, ["#### 3", "#### 5", "#### 7", "hello"], URPO_RECORDS, engine)
    out = SelfReferee(samples=2, open_share=0.0)(batch, ctx)
    s = out.stats
    # the referee prompt shows each group's responses, numbered
    assert "Response 1:\n#### 3\n\nResponse 2:\n#### 5" in engine.calls[0][0][0]
    # A's two referee rows train (B's do not: no ground truth): 1 − (1/3 + 1/3)/2 = 2/3, and 0 (malformed)
    assert len(out) == 6 and out.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert out.completions[4:] == ["Scores: 7, 4", "Scores: 4"]
    assert out.term("referee").tolist() == pytest.approx([0, 0, 0, 0, 2 / 3, 0])
    # B's players: the mean over the parsed replies, (2/3 + 1)/2 = 5/6 and (0 + 1/3)/2 = 1/6, in place of the terms
    assert out.term("self_reward").tolist() == pytest.approx([0, 0, 5 / 6, 1 / 6, 0, 0])
    assert out.reward.tolist() == pytest.approx([1.0, 0.0, 5 / 6, 1 / 6, 2 / 3, 0.0])
    assert out.reward_names == ["accuracy", "referee", "self_reward"]
    assert s["urpo/referee_prompts"] == 2.0 and s["urpo/referee_rows"] == 2.0
    assert s["urpo/referee_reward_mean"] == pytest.approx(1 / 3) and s["urpo/referee_agreement"] == 1.0
    assert s["urpo/referee_parse_failures"] == 1.0 and s["urpo/referee_malformed"] == 1.0
    assert s["urpo/referee_parsed"] == 3.0 and s["urpo/open_groups"] == 1.0 and s["urpo/unrewarded_groups"] == 0.0
    assert s["urpo/self_reward_mean"] == pytest.approx(0.5) and s["urpo/self_rewarded_groups"] == 1.0
    assert s["urpo/solution_accuracy"] == 0.25


def test_urpo_hidden_labels_make_every_group_open(tiny):
    engine = Scripted(_urpo_reply)
    batch, ctx = _batch_and_ctx(tiny, ["#### 3", "#### 5", "#### 7", "hello"], URPO_RECORDS, engine)
    out = SelfReferee(samples=2, open_share=1.0, reward="pairwise")(batch, ctx)
    # no referee row trains; A's players get the referee's 2/3 and 1/3 instead of the verifier's 1 and 0
    assert len(out) == 4 and out.stats["urpo/referee_rows"] == 0.0 and out.stats["urpo/open_groups"] == 2.0
    assert out.reward.tolist() == pytest.approx([2 / 3, 1 / 3, 5 / 6, 1 / 6])
    assert out.term("accuracy").tolist() == [1.0, 0.0, 0.0, 0.0]  # still logged
    # the hidden labels: 2/3 ≥ 1/2 with a correct answer, 1/3 < 1/2 with a wrong one
    assert out.stats["urpo/self_reward_rule_agreement"] == 1.0


def test_refuses_a_late_place_an_unknown_label_term_and_a_multi_turn_rollout(tiny):
    batch, ctx = _batch_and_ctx(tiny, RISE_SOLUTIONS, RECORDS, Scripted(_rise_reply))
    with pytest.raises(KeyError, match="label_term='correct'"):
        SelfVerification(label_term="correct")(batch, ctx)
    ctx.rollout.needs_records = True
    with pytest.raises(ValueError, match="single-turn rollout"):
        RecycledJudging()(batch, ctx)
    ctx.rollout.needs_records = False
    from rlexp.algorithms.group_stages.base import append_reward_column

    late = append_reward_column(batch, "bonus", torch.zeros(4))
    with pytest.raises(ValueError, match="first among the group stages"):
        SelfReferee()(late, ctx)


@pytest.mark.parametrize(
    "cls,kwargs,match",
    [
        (SelfVerification, {"verify_share": 0.0}, "verify_share"),
        (SelfVerification, {"samples": 0}, "samples"),
        (SelfVerification, {"outcome_scores": [1.0, -0.5]}, "outcome_scores"),
        (SelfVerification, {"outcome_scores": [2.0, -0.5, -1.0]}, "outcome_scores"),
        (SelfVerification, {"template": "{question} only"}, "template lacks {solution}"),
        (SelfVerification, {"pattern": "boxed"}, "pattern"),
        (SelfVerification, {"label_term": ""}, "label_term"),
        (RecycledJudging, {"judge_on": "reasoning"}, "judge_on"),
        (RecycledJudging, {"pointwise_prob": 1.5}, "pointwise_prob"),
        (RecycledJudging, {"judge_share": 0.0, "reflection_share": 0.0}, "judge_share and reflection_share"),
        (RecycledJudging, {"pairwise_template": "{question} {a}"}, "pairwise_template lacks {b}"),
        (SelfReferee, {"reward": "listwise"}, "reward"),
        (SelfReferee, {"open_share": -0.1}, "open_share"),
        (SelfReferee, {"scale": [10, 1]}, "scale"),
        (SelfReferee, {"self_name": "referee"}, "self_name"),
        (SelfReferee, {"template": "{question} {responses}"}, "template lacks {n}"),
    ],
)
def test_bad_settings_name_the_key(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


# ---------------------------------------------------------------- two training steps on the tiny model


class ScriptedJudge(HFRollout):
    """The real engine (rollout=hf), except that a call whose prompts are all judge prompts (a verification, judge or
    referee prompt, by its wording) gets ``REPLIES[kind]`` in turn for each prompt: the tiny model's own verdicts
    never parse."""

    MARKS = {"### Response Begin ###": "rise", "<Judgement>:": "spark", "You are the referee": "urpo"}
    REPLIES = {
        # RISE: a verdict of 1, of −1, none, of −0.5: exactly one equals any target r_o
        "rise": ["\\boxed{1}", "\\boxed{-1}", "no verdict", "\\boxed{-0.5}"],
        # SPARK: exactly one equals a pointwise (Yes/No) or a pairwise (A/B) label, the other kind's two malformed
        "spark": ["\\boxed{Yes}", "\\boxed{No}", "\\boxed{A}", "\\boxed{B}"],
        # URPO (4 responses a group): two parsed replies, a missing and a malformed one
        "urpo": ["Scores: 10, 1, 1, 1", "Scores: 1, 10, 10, 10", "no scores", "Scores: 5, 5"],
    }

    def generate(self, model, tokenizer, prompts, num_generations=1, *args, **kwargs):
        kinds = {next((k for m, k in self.MARKS.items() if m in p), None) for p in prompts}
        if prompts and len(kinds) == 1 and None not in kinds:
            own = self.REPLIES[kinds.pop()]
            replies = [own[k % len(own)] for _ in prompts for k in range(num_generations)]
            expanded = [p for p in prompts for _ in range(num_generations)]
            return scripted_output(tokenizer, expanded, replies, next(model.parameters()).device)
        return super().generate(model, tokenizer, prompts, num_generations, *args, **kwargs)


SCRIPTED = "rollout._target_=tests.algorithms.test_self_verification.ScriptedJudge"


def _trained(m):
    assert math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert m["advantage/abs_mean"] > 0


@pytest.mark.long  # PPO with a critic, 2 prompts x 4 solutions + 4 verifications a step (~20 s CPU)
def test_rise_two_steps_counts_the_unparsed_verdicts_of_the_tiny_model(tiny_cfg):
    result = run(tiny_cfg(*VARYING, "algorithm=rise", "trainer.autocast=off"))
    m = result.metrics
    assert result.last_step == 2
    _trained(m)
    assert m["critic/value_loss"] > 0 and math.isfinite(m["critic/grad_norm"])
    # one verified solution (0.125 x 2 groups, at least one), G = 4 replies; none parses: each rewarded −1
    assert m["rise/verify_rows"] == 4.0 and m["batch/completions"] == 12.0
    assert m["rise/verify_parse_failures"] == 4.0 and m["rise/verify_accuracy"] == 0.0
    assert m["reward/verification/mean"] == pytest.approx(-4 / 12)


@pytest.mark.long
def test_rise_two_steps_with_scripted_verdicts(tiny_cfg):
    m = run(tiny_cfg(*VARYING, "algorithm=rise", "trainer.autocast=off", SCRIPTED)).metrics
    _trained(m)
    # whatever the verified solution's r_o (1 or −1 here: the tiny model states no answer), one reply of four gives it
    assert m["rise/verify_rows"] == 4.0 and m["rise/verify_accuracy"] == pytest.approx(0.25)
    assert m["rise/verify_parse_failures"] == 1.0 and m["rise/verify_missing"] == 1.0
    assert m["reward/verification/std"] > 0  # 1, −1, −0.5 rewards among the verification rows


@pytest.mark.long
def test_spark_two_steps_with_scripted_verdicts(tiny_cfg):
    overrides = [
        "algorithm.group_stages.0.judge_on=solution",  # the tiny model states no answers
        "algorithm.group_stages.0.correct_min=2.0",  # no vowel share reaches it: every group all wrong
    ]
    m = run(tiny_cfg(*VARYING, "algorithm=spark_coevolve", "trainer.autocast=off", SCRIPTED, *overrides)).metrics
    _trained(m)
    # 2 groups, all wrong: two pointwise items (label No), capped at 0.5 x 2 = 1; G = 4 replies, one of them "No"
    assert m["spark/judge_items"] == 1.0 and m["spark/pointwise_items"] == 1.0 and m["spark/judge_rows"] == 4.0
    assert m["spark/judge_accuracy"] == pytest.approx(0.25) and m["spark/judge_parse_failures"] == 2.0
    # reflections: the first group's wrong reasoning (the second's would need a stated answer): 4 rows, run's terms
    assert m["spark/reflection_items"] == 1.0 and m["spark/reflection_rows"] == 4.0
    assert m["batch/completions"] == 16.0 and m["reward/judge/std"] > 0


@pytest.mark.long
def test_urpo_two_steps_with_scripted_scores(tiny_cfg):
    m = run(tiny_cfg(*VARYING, "algorithm=urpo", "trainer.autocast=off", SCRIPTED)).metrics
    _trained(m)
    # open_share 0.25 of 2 groups: one open, one referee group of 4 rows that train
    assert m["urpo/open_groups"] == 1.0 and m["urpo/referee_rows"] == 4.0 and m["batch/completions"] == 12.0
    assert m["urpo/referee_parse_failures"] == 4.0 and m["urpo/referee_missing"] == 2.0
    # the open group's players: the mean of (1, 0, 0, 0) and (0, 1, 1, 1): 1/2 each
    assert m["urpo/self_reward_mean"] == pytest.approx(0.5) and m["urpo/self_rewarded_groups"] == 1.0
    assert m["reward/referee/std"] > 0 and m["reward/self_reward/mean"] > 0
