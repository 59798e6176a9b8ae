"""A judge with an evolving rubric (rlexp.rewards.meta_rubric, MPO, arXiv 2504.20157): the meta prompt's rows and the
rubric parse by hand, a rubric update with a scripted judge and meta judge (the loophole closes, the cache clears),
the fallbacks (no rubric, too short, a failed generation keep the old one and count), bad settings, and two training
steps of reward=mpo on the tiny model (long)."""

import math

import pytest

from rlexp.rewards import judges
from rlexp.rewards.meta_rubric import INITIAL_RUBRIC, MetaRubricJudge, parse_rubric, select_rows
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run

PADDED = "4 " * 30
STRICT = "Penalise padding: an answer that repeats itself gets 1."


def test_select_rows_best_then_worst_by_hand():
    rows = [("q", "a", 0.2), ("q", "b", 0.9), ("q", "c", None), ("q", "d", 0.5), ("q", "b", 0.9), ("q", "e", 0.7)]
    # distinct: a .2, b .9, c none, d .5, e .7; best first: b, e, d, a, c (no grade: the worst)
    assert [r[1] for r in select_rows(rows, 10)] == ["b", "e", "d", "a", "c"]
    assert [r[1] for r in select_rows(rows, 3)] == ["b", "e", "c"]  # ceil(3/2) = 2 best, floor(3/2) = 1 worst
    assert [r[1] for r in select_rows(rows, 4)] == ["b", "e", "a", "c"]
    assert [r[1] for r in select_rows(rows, 1)] == ["b"]


def test_parse_rubric_by_hand():
    assert parse_rubric("<rubric> Be exact. </rubric>", 1, 100) == "Be exact."
    assert parse_rubric("<rubric>draft</rubric> then <rubric>final one</rubric>", 1, 100) == "final one"
    assert parse_rubric("<rubric><rubric>inner</rubric>", 1, 100) == "inner"  # the prefill repeated by the model
    assert parse_rubric("<RUBRIC>Upper</RUBRIC>", 1, 100) == "Upper"
    assert parse_rubric("<rubric>never closed", 1, 100) is None and parse_rubric("", 1, 100) is None
    assert parse_rubric("<rubric>short</rubric>", 10, 100) is None  # 5 chars < 10
    assert parse_rubric("<rubric>" + "x" * 11 + "</rubric>", 1, 10) is None  # too long
    assert parse_rubric("</rubric> stray <rubric>", 1, 100) is None


def grader(texts):
    """A judge that is fooled by padding (grade 10) unless the rubric says to penalise it; '4' gets 8; else 3."""
    out = []
    for t in texts:
        rubric = t.split("Rubric:\n", 1)[1].split("\n\n", 1)[0]
        answer = t.split("Answer:\n", 1)[1].split("\n\n", 1)[0]
        if answer == PADDED.strip() or answer == PADDED:
            out.append(" 1" if "Penalise padding" in rubric else " 10")
        else:
            out.append(" 8" if answer == "4" else " 3")
    return out


def batch(answers):
    return [Sample("p", a, {"question": "What is 2 + 2?"}, 0, 3, False) for a in answers]


def test_the_meta_judge_rewrites_the_rubric_and_the_loophole_closes():
    prompts = []

    def meta(texts):
        prompts.extend(texts)
        return [f" {STRICT}</rubric>"]  # the backend prefills "<rubric>"

    judge = MetaRubricJudge(generate=grader, meta_generate=meta, update_every=2, meta_samples=2)
    first = judge(batch([PADDED, "4", "5"]))
    # 10 -> 1, 8 -> 7/9, 3 -> 2/9 under the initial rubric: padding pays most (the hack)
    assert first.scores == pytest.approx([1.0, 7 / 9, 2 / 9])
    assert first.metrics["rubric_version"] == 0 and first.metrics["meta_calls"] == 0 and prompts == []
    second = judge(batch([PADDED, "4"]))  # all cached; the 2nd call: the meta judge refines the rubric
    assert second.metrics["cache_hits"] == 2 and second.scores == pytest.approx([1.0, 7 / 9])
    assert second.metrics["rubric_version"] == 1 and second.metrics["rubric_updates"] == 1
    assert second.metrics["meta_failures"] == 0 and second.metrics["rubric_chars"] == len(STRICT)
    # the meta prompt held the current rubric and 2 rows: the best (the padding, 1.00) and the worst ("5", 0.22)
    assert len(prompts) == 1 and INITIAL_RUBRIC in prompts[0]
    assert "[1] grade 1.00" in prompts[0] and "[2] grade 0.22" in prompts[0] and "Answer: 5" in prompts[0]
    assert judge.rubric == STRICT and judge.rubrics == [INITIAL_RUBRIC, STRICT] and judge.history == []
    third = judge(batch([PADDED, "4"]))  # the cache was cleared: graded again, under the new rubric
    assert third.metrics["cache_hits"] == 0 and third.scores == pytest.approx([0.0, 7 / 9])
    assert STRICT in judge.prompt("q", "a")


@pytest.mark.parametrize(
    "reply",
    [" I would rather not.", " too short</rubric>", None],  # no closed rubric; 9 chars < 20; generation raises
)
def test_a_bad_meta_reply_keeps_the_old_rubric_and_counts(reply):
    def meta(texts):
        if reply is None:
            raise RuntimeError("CUDA out of memory")
        return [reply]

    judge = MetaRubricJudge(generate=grader, meta_generate=meta, update_every=1)
    res = judge(batch([PADDED, "4"]))
    assert res.metrics["meta_failures"] == 1 and res.metrics["meta_calls"] == 1
    assert res.metrics["rubric_version"] == 0 and res.metrics["rubric_updates"] == 0
    assert judge.rubric == INITIAL_RUBRIC and res.scores == pytest.approx([1.0, 7 / 9])
    assert judge(batch(["4"])).metrics["cache_hits"] == 1  # the cache stays with the unchanged rubric


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match=r"MetaRubricJudge.template has no \{rubric\} field"):
        MetaRubricJudge(generate=grader, template="{question} {completion}")
    with pytest.raises(ValueError, match=r"MetaRubricJudge.meta_template has no \{samples\} field"):
        MetaRubricJudge(generate=grader, meta_template="{rubric}")
    with pytest.raises(ValueError, match="update_every=0"):
        MetaRubricJudge(generate=grader, update_every=0)
    with pytest.raises(ValueError, match="min_rubric_chars"):
        MetaRubricJudge(generate=grader, min_rubric_chars=50, max_rubric_chars=10)
    with pytest.raises(ValueError, match="GenerativeJudge.judge_model is not set"):
        MetaRubricJudge()


@pytest.mark.long
def test_mpo_trains_two_steps_on_the_tiny_model(tiny_cfg, monkeypatch):
    real = judges.JudgeBackend.__call__
    asked = []

    def call(self, texts):  # the tiny random model never writes a rubric: script the meta judge, keep the grader real
        if self.owner != "MetaRubricJudge.meta":
            return real(self, texts)
        asked.append(texts[0])
        return [f"<rubric>Rubric {len(asked)}: grade the arithmetic, not the length.</rubric>"]

    monkeypatch.setattr(judges.JudgeBackend, "__call__", call)
    cfg = tiny_cfg(
        "reward=mpo",
        "reward.terms.judge.update_every=1",
        "reward.terms.judge.max_new_tokens=8",
        "trainer.autocast=off",
    )
    m = run(cfg).metrics
    assert math.isfinite(m["loss/total"]) and len(asked) == 2  # one meta call per step
    assert m["reward/judge/rubric_version"] == 2 and m["reward/judge/rubric_updates"] == 2
    assert m["reward/judge/meta_failures"] == 0 and "Rubric 1:" in asked[1]  # the 2nd meta prompt saw rubric 1


@pytest.mark.long
def test_mpo_with_the_tiny_models_own_meta_replies_counts_failures(tiny_cfg):
    cfg = tiny_cfg(
        "reward=mpo",
        "reward.terms.judge.update_every=1",
        "reward.terms.judge.max_new_tokens=8",
        "reward.terms.judge.meta_max_new_tokens=12",
        "trainer.autocast=off",
    )
    m = run(cfg).metrics
    assert m["reward/judge/meta_calls"] == 2  # the random model writes no closed rubric: both keep the old one
    assert m["reward/judge/meta_failures"] == 2 and m["reward/judge/rubric_version"] == 0
