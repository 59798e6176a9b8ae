"""FAPO's flawed-positive penalty (rlexp.rewards.flaws): the step numbering and the verdict parser by hand, the
penalty on scripted verdicts (only correct rollouts judged, −1 on a flawed positive, λ as the weight, unparsed
verdicts counted as failures and not penalised, the cache), the rendered prompt, config errors, and two training
steps of reward=fapo on the tiny model (long)."""

import math

import pytest

from rlexp.rewards.flaws import FlawedPositivePenalty, number_steps, parse_flaw
from rlexp.rewards.terms import RewardTerm, Sample
from rlexp.runs.training import run


def sample(completion, answer="4", group=0):
    return Sample("p", completion, {"question": "What is 2 + 2?", "answer": answer}, group, 5, False)


def test_number_steps_by_paragraph_from_zero():
    text, n = number_steps("2 + 2 = 4.\n\nSo it is 4.\n#### 4")
    assert n == 2 and text == "Step 0: 2 + 2 = 4.\nStep 1: So it is 4.\n#### 4"
    assert number_steps("#### 4") == ("Step 0: #### 4", 1)  # one paragraph: one step
    assert number_steps("a\nb", "lines")[1] == 2


def test_parse_flaw_by_hand():
    assert parse_flaw("All steps hold. \\boxed{-1}", 3) == -1  # no flaw
    assert parse_flaw("Step 1 guesses. \\boxed{1}", 3) == 1  # the earliest flawed step
    assert parse_flaw("\\boxed{2} ... on reflection \\boxed{0}", 3) == 0  # the last box counts
    assert parse_flaw("\\boxed{3}", 3) is None  # out of range: steps are 0, 1, 2
    assert parse_flaw("\\boxed{-2}", 3) is None and parse_flaw("\\boxed{one}", 3) is None
    assert parse_flaw("Step 1 is wrong.", 3) is None and parse_flaw("", 3) is None  # missing


def scripted(replies):
    """A judge that answers from a queue, recording the prompts it was asked."""
    asked = []

    def generate(texts):
        asked.extend(texts)
        return [replies.pop(0) for _ in texts]

    return generate, asked


def test_penalty_on_given_verdicts_by_hand():
    gen, asked = scripted(["\\boxed{-1}", "\\boxed{0}", "no verdict"])
    term = FlawedPositivePenalty(weight=0.5, generate=gen)
    rows = [
        sample("2 + 2 = 4.\n#### 4"),  # correct, judged sound: 0
        sample("I guess.\n\n#### 4"),  # correct, step 0 flawed: a flawed positive, -1
        sample("#### 5"),  # wrong: never judged, 0
        sample("2 + 2 is 4\n#### 4"),  # correct, verdict does not parse: a failure, not penalised
    ]
    res = term(rows)
    assert res.scores == [0.0, -1.0, 0.0, 0.0]
    assert res.failures == [False, False, False, True]
    assert len(asked) == 3  # the wrong rollout never reaches the judge
    m = res.metrics
    assert m["positives"] == 3 and m["judged"] == 3 and m["cache_hits"] == 0
    assert m["flawed_positive_frac"] == 0.5  # 1 flawed of the 2 correct rows whose verdict parsed
    assert m["penalty_mean"] == 0.5 * 1 / 4  # λ × 1 penalised row of 4
    assert m["parsed_frac"] == pytest.approx(2 / 3)
    # the summed reward accuracy + λ·score: 1, 0.5, 0, 1 — the flawed positive lands midway (FAPO's 0 on ±1)
    acc = [1.0, 1.0, 0.0, 1.0]
    assert [a + term.weight * s for a, s in zip(acc, res.scores)] == [1.0, 0.5, 0.0, 1.0]
    # the same rows again: verdicts come from the cache (the unparsed one too), nothing is generated
    again = term(rows)
    assert again.scores == res.scores and again.metrics["cache_hits"] == 3 and again.metrics["judged"] == 0


def test_rendered_prompt_holds_question_reference_and_numbered_steps():
    gen, asked = scripted(["\\boxed{-1}"])
    FlawedPositivePenalty(generate=gen)([sample("Add them.\n\n#### 4")])
    p = asked[0]
    assert "Problem:\nWhat is 2 + 2?\n\n" in p and "Reference answer:\n4\n\n" in p
    assert "Solution:\nStep 0: Add them.\nStep 1: #### 4\n\n" in p and p.endswith("Put the number in \\boxed{}.")


def test_custom_verifier_and_threshold():
    class Half(RewardTerm):
        def score(self, s):
            return 0.5

    gen, asked = scripted(["\\boxed{0}"])
    term = FlawedPositivePenalty(weight=1.0, verifier=Half(), correct_at=0.5, generate=gen)
    assert term([sample("anything")]).scores == [-1.0] and len(asked) == 1


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="FlawedPositivePenalty.judge_model is not set"):
        FlawedPositivePenalty()
    with pytest.raises(ValueError, match="weight=-1"):
        FlawedPositivePenalty(weight=-1, judge_model="initial")
    with pytest.raises(ValueError, match="split='words'"):
        FlawedPositivePenalty(judge_model="initial", split="words")
    with pytest.raises(ValueError, match="no \\{steps\\} field"):
        FlawedPositivePenalty(judge_model="initial", template="{question} {ground_truth}")
    with pytest.raises(ValueError, match="a field other than"):
        FlawedPositivePenalty(judge_model="initial", template="{question} {steps} {rubric}")
    with pytest.raises(ValueError, match="no capturing group"):
        FlawedPositivePenalty(judge_model="initial", pattern=r"\\boxed\{-?\d+\}")


@pytest.mark.long
def test_reward_fapo_trains_two_steps_with_the_tiny_judge(tiny_cfg):
    # the tiny random model never answers right: the verifier is the vowel share (>= 0.3 counts as "correct"), so
    # rows reach the judge; pre-filled with "\boxed{" the random judge still rarely writes a valid step index
    cfg = tiny_cfg(
        "reward=fapo",
        "reward.terms.fapo.verifier._target_=tests.algorithms.varying_reward.VowelShare",
        "reward.terms.fapo.correct_at=0.3",
        "reward.terms.fapo.max_new_tokens=4",
        "reward.terms.fapo.reply_prefix='\\boxed{'",
        "trainer.autocast=off",
    )
    m = run(cfg).metrics
    rows = 2 * 4  # prompts_per_step x num_generations of the tiny run
    assert m["reward/fapo/positives"] > 0
    assert m["reward/fapo/judged"] + m["reward/fapo/cache_hits"] == m["reward/fapo/positives"]
    # every judged row either parsed or is counted as a failure
    assert m["reward/fapo/failures"] == pytest.approx((1 - m["reward/fapo/parsed_frac"]) * m["reward/fapo/positives"])
    assert 0.0 <= m["reward/fapo/flawed_positive_frac"] <= 1.0 and m["reward/fapo/penalty_mean"] >= 0.0
    assert m["reward/fapo/failures"] <= rows and math.isfinite(m["loss/total"])


def first_step_flawed(texts):
    """A scripted judge for the two-step run: every solution is flawed at step 0."""
    return ["\\boxed{0}" for _ in texts]


@pytest.mark.long
def test_reward_fapo_penalises_every_flawed_positive_in_two_steps(tiny_cfg):
    # the scripted judge flags every judged rollout: each "correct" row (vowel share >= 0.3) is a flawed positive
    cfg = tiny_cfg(
        "reward=fapo",
        "reward.terms.fapo.verifier._target_=tests.algorithms.varying_reward.VowelShare",
        "reward.terms.fapo.correct_at=0.3",
        "+reward.terms.fapo.generate={_target_: tests.rewards.test_flaws.first_step_flawed, _partial_: true}",
        "trainer.autocast=off",
    )
    m = run(cfg).metrics
    rows = 2 * 4
    assert m["reward/fapo/positives"] > 0 and m["reward/fapo/failures"] == 0
    assert m["reward/fapo/flawed_positive_frac"] == 1.0
    assert m["reward/fapo/penalty_mean"] == pytest.approx(0.5 * m["reward/fapo/positives"] / rows)
    assert m["reward/fapo/mean"] == pytest.approx(-m["reward/fapo/positives"] / rows)
    assert math.isfinite(m["loss/total"])
