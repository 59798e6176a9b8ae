"""Generative judges (rlexp.rewards.judges): score and verdict parsing by hand (valid, malformed, missing, out of
range), position-swap averaging, the pointwise term with a scripted judge (failures, cache), the pairwise judge's
preference matrix and win rates on a hand-drawn group, and two training steps on the tiny model: reward=judge (the
random judge never parses: every row a failure, training goes on) and spo_minimax with the model judge."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.preference import PREFERENCE, PairwisePreference, model_preference, win_rates
from rlexp.rewards.judges import (
    GenerativeJudge,
    JudgeBackend,
    PairwiseJudge,
    parse_score,
    parse_verdict,
    swap_average,
)
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch

NAN = float("nan")


def test_parse_score_valid_by_hand():
    assert parse_score("Looks right.\nScore: 7") == pytest.approx(6 / 9)  # (7 - 1) / (10 - 1)
    assert parse_score("<score>10</score>") == 1.0 and parse_score("score = 1") == 0.0
    assert parse_score("Score: **4**") == pytest.approx(3 / 9)  # markdown bold
    assert parse_score("Score: 5.5") == pytest.approx(0.5)
    assert parse_score("Score: 2 at first; on reflection Score: 9") == pytest.approx(8 / 9)  # the last grade counts
    assert parse_score("Score: 25/100", scale=(0, 100)) == 0.25


def test_parse_score_malformed_missing_and_out_of_range_are_none():
    assert parse_score("Score: seven") is None  # malformed: not a number
    assert parse_score("End with 'Score: N'") is None  # the instruction echoed
    assert parse_score("") is None and parse_score("A fine answer, I'd say 8.") is None  # missing
    assert parse_score("Score: 11") is None and parse_score("Score: 0") is None  # out of [1, 10]
    assert parse_score("Score: -3") is None


def test_parse_verdict_words_and_unknown_words():
    table = {"correct": 1.0, "incorrect": 0.0}
    assert parse_score("Verdict: Incorrect", r"verdict:\s*(\w+)", verdicts=table) == 0.0
    assert parse_score("verdict: CORRECT", r"verdict:\s*(\w+)", verdicts=table) == 1.0
    assert parse_score("Verdict: maybe", r"verdict:\s*(\w+)", verdicts=table) is None


def test_parse_pairwise_verdicts_by_hand():
    assert parse_verdict("Verdict: A") == 1.0 and parse_verdict("verdict: b") == 0.0
    assert parse_verdict("Verdict: tie") == 0.5 and parse_verdict("Verdict: [A]") == 1.0
    assert parse_verdict("<verdict>B</verdict>") == 0.0
    assert parse_verdict("Verdict: A\nWait, no. Verdict: B") == 0.0  # the last one counts
    assert parse_verdict("Verdict: C") is None and parse_verdict("Answer A is better.") is None
    assert parse_verdict("") is None


def test_swap_average_cancels_a_position_bias():
    assert swap_average(1.0, 1.0) == 0.5  # "A" both times: the judge only likes the first slot -> a tie
    assert swap_average(1.0, 0.0) == 1.0  # a first, then (b, a) -> "B" = a again: a wins
    assert swap_average(0.5, 0.0) == 0.75 and swap_average(0.0, 1.0) == 0.0
    assert swap_average(1.0, None) is None and swap_average(None, 0.0) is None


def scripted(grades: dict, log: list | None = None):
    """A judge whose reply depends on which answer the prompt holds ('Score: N' from ``grades``, else no grade)."""

    def generate(texts):
        if log is not None:
            log.append(len(texts))
        out = []
        for t in texts:
            answer = t.split("Answer:\n", 1)[1].split("\n\n", 1)[0]
            out.append(f"Score: {grades[answer]}" if answer in grades else "I cannot say.")
        return out

    return generate


def _samples(completions):
    return [Sample("p", c, {"question": "What is 1 + 1?"}, 0, 3, False) for c in completions]


def test_pointwise_judge_scores_fails_and_caches():
    log = []
    judge = GenerativeJudge(generate=scripted({"2": 10, "3": 1, "two": 4}, log), failure_score=-1.0)
    res = judge(_samples(["2", "3", "two", "junk"]))
    # 10 -> 1, 1 -> 0, 4 -> 3/9; "junk": no grade -> a failure, scored failure_score
    assert res.scores == pytest.approx([1.0, 0.0, 1 / 3, -1.0]) and res.failures == [False, False, False, True]
    assert res.metrics == {"parsed_frac": 0.75, "cache_hits": 0.0, "judged": 4.0}
    again = judge(_samples(["junk", "2", "5"]))  # "junk" and "2" cached (a failure too), "5" asked
    assert again.scores == pytest.approx([-1.0, 1.0, -1.0]) and again.failures == [True, False, True]
    assert again.metrics["cache_hits"] == 2 and again.metrics["judged"] == 1 and log == [4, 1]
    assert "Question:\nWhat is 1 + 1?" in judge.prompt("What is 1 + 1?", "2")
    # the reply is pre-filled with "Score:": a judge that only writes the number is parsed
    assert GenerativeJudge(generate=lambda texts: [" 7"] * len(texts))(_samples(["2"])).scores == [pytest.approx(2 / 3)]


def test_judge_bad_settings_name_the_key():
    with pytest.raises(ValueError, match=r"GenerativeJudge.judge_model is not set"):
        GenerativeJudge()
    with pytest.raises(ValueError, match=r"judge_model='teacher'"):
        GenerativeJudge(judge_model="teacher")
    with pytest.raises(ValueError, match=r"has no \{completion\} field"):
        GenerativeJudge(judge_model="initial", template="Grade {question}")
    with pytest.raises(ValueError, match="other than"):
        GenerativeJudge(judge_model="initial", template="{question} {completion} {rubric}")
    with pytest.raises(ValueError, match="no capturing group"):
        GenerativeJudge(judge_model="initial", pattern=r"Score: \d+")
    with pytest.raises(ValueError, match=r"scale=\[10.0, 1.0\]"):
        GenerativeJudge(judge_model="initial", scale=[10, 1])
    with pytest.raises(ValueError, match="policy=true"):
        GenerativeJudge(judge_model="initial", policy=True)
    with pytest.raises(ValueError, match="judge='model'"):
        PairwisePreference(judge="model")  # the judge model must be named


def test_policy_judge_sees_the_live_model_and_initial_a_frozen_copy(tiny):
    live = JudgeBackend("policy", max_new_tokens=2)
    frozen = JudgeBackend("initial", max_new_tokens=2)
    for b in (live, frozen):
        b.bind(tiny.model, tiny.tokenizer)
    assert live.model()[0] is tiny.model and live.live
    copy_ = frozen.model()[0]
    assert copy_ is not tiny.model and not any(p.requires_grad for p in copy_.parameters()) and not frozen.live
    state = torch.random.get_rng_state()
    assert len(frozen(["Say hi.", "Say bye."])) == 2
    assert torch.equal(state, torch.random.get_rng_state())  # the run's random stream did not move
    with pytest.raises(RuntimeError, match="has not been given"):
        JudgeBackend("initial").model()


def pairwise_script(texts):
    """A judge that prefers the answer saying 'right'; it cannot judge anything holding 'junk'."""
    out = []
    for t in texts:
        a = t.split("Answer A:\n", 1)[1].split("\n\n", 1)[0]
        b = t.split("Answer B:\n", 1)[1].split("\n\n", 1)[0]
        if "junk" in a or "junk" in b:
            out.append("Hmm.")
        elif ("right" in a) == ("right" in b):
            out.append("Verdict: tie")
        else:
            out.append("Verdict: A" if "right" in a else "Verdict: B")
    return out


def test_pairwise_compare_swaps_caches_and_fails():
    judge = PairwiseJudge(generate=pairwise_script)
    assert judge.compare("q", "right", "wrong") == 1.0 and judge.stats["asked"] == 2  # (a, b) and (b, a)
    assert judge.compare("q", "wrong", "right") == 0.0 and judge.stats == {"asked": 0, "unparsed": 0, "cache_hits": 1}
    assert judge.compare("q", "right", "right too") == 0.5
    assert judge.compare("q", "right", "junk") is None and judge.stats["unparsed"] == 2
    biased = PairwiseJudge(generate=lambda texts: ["Verdict: A"] * len(texts))
    assert biased.compare("q", "right", "wrong") == 0.5  # always the first slot: a tie once swapped
    assert PairwiseJudge(generate=lambda t: ["Verdict: A"] * len(t), swap=False).compare("q", "x", "y") == 1.0


def test_model_preference_and_win_rates_on_a_hand_drawn_group():
    # group 0: right, wrong, junk (the judge cannot read junk); group 1: two right answers (a tie)
    batch = make_batch([0.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1])
    batch.completions = ["right", "wrong", "junk", "right too", "right also"]
    pref = model_preference(PairwiseJudge(generate=pairwise_script), batch)
    expected = [[NAN, 1.0, NAN], [0.0, NAN, NAN], [NAN, NAN, NAN], [NAN, 0.5, NAN], [0.5, NAN, NAN]]
    assert torch.allclose(pref, torch.tensor(expected), equal_nan=True)
    # row 0 beat its one judged peer: 1; row 1 lost: 0; row 2 has no judged peer: 1/2; the tie: 1/2 each
    assert win_rates(pref).tolist() == [1.0, 0.0, 0.5, 0.5, 0.5]


def test_the_stage_with_the_model_judge_counts_failures_and_rule_agreement():
    batch = make_batch([0.0, 1.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1])
    batch.completions = ["right", "wrong", "junk", "right too", "right also"]
    stage = PairwisePreference(judge="model", judge_model="initial", judge_options={"generate": pairwise_script})
    out = stage(batch, SimpleNamespace(step=1, policy=None, tokenizer=None))
    assert out.stats["pref/judge_failures"] == 2  # the pairs (right, junk) and (wrong, junk)
    # judged: (0, 1) — the judge says row 0, the rule (rewards 0 < 1) row 1: disagree; (3, 4) both tie: agree
    assert out.stats["pref/judge_rule_agreement"] == 0.5
    assert torch.isnan(out.extras[PREFERENCE][2]).all()
    with pytest.raises(ValueError, match="judge_options.*need judge='model'"):
        PairwisePreference(judge_options={"swap": False})
    with pytest.raises(ValueError, match="unexpected keyword"):
        PairwisePreference(judge="model", judge_model="initial", judge_options={"swapp": False})


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_reward_judge_trains_two_steps_and_counts_every_unparsed_row(tiny_cfg):
    cfg = tiny_cfg("reward=judge", "reward.terms.judge.max_new_tokens=8", "trainer.autocast=off")
    m = run(cfg).metrics
    rows = 2 * 4  # prompts_per_step x num_generations of the tiny run
    assert m["reward/judge/failures"] == rows and m["reward/judge/parsed_frac"] == 0.0  # a random judge never grades
    assert m["reward/judge/mean"] == 0.0 and math.isfinite(m["loss/total"])
    assert m["reward/judge/judged"] + m["reward/judge/cache_hits"] == rows  # every row went to the judge


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_spo_minimax_with_the_model_judge_trains_two_steps(tiny_cfg):
    cfg = tiny_cfg(
        "algorithm=spo_minimax",
        "algorithm.group_stages.0.judge=model",
        "+algorithm.group_stages.0.judge_model=initial",
        "+algorithm.group_stages.0.judge_options={max_new_tokens: 6, batch_size: 16}",
        "trainer.autocast=off",
    )
    m = run(cfg).metrics
    assert m["pref/judge_failures"] == 2 * 6  # 2 groups of 4: 6 pairs each, none judged by the random model
    assert m["pref/judge_replies"] == 2 * 6 * 2  # each pair asked in both orders
    assert "pref/judge_rule_agreement" not in m and math.isfinite(m["loss/total"])
    assert m["reward/win_rate/mean"] == 0.5 and m["pref/pairs_per_group"] == 0
