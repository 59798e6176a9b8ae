"""SGPO's graded negatives (rlexp.algorithms.group_stages.stepwise_graded): the graded value by hand, the stage on a
hand-made batch with a stand-in step judge (``generate=``) and with a process term, bad settings, and two training
steps of algorithm=sgpo on the tiny model (long)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rlexp.algorithms.group_stages.stepwise_graded import StepwiseGradedNegatives, graded_value, split_into_steps
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch


def test_graded_value_by_hand():
    # verdicts right, right, wrong, right: the first wrong step is k = 3 of n = 4 → (3 − 1)/4 = 0.5
    assert graded_value([1, 1, 0, 1]) == 0.5
    assert graded_value([1, 1, 0, 1], "share") == 0.75  # 3 of 4 right
    assert graded_value([0.9, 0.8, 0.2, 0.7], "share") == pytest.approx(0.65)  # soft: (0.9 + 0.8 + 0.2 + 0.7)/4
    assert graded_value([0.9, 0.8, 0.2, 0.7], "share", threshold=0.5) == 0.75  # hard: 3 of 4 right
    # soft first error: (0.9 + 0.9·0.5)/2 = 0.675, the expected right prefix over n
    assert graded_value([0.9, 0.5]) == pytest.approx(0.675)
    assert graded_value([0.9, 0.6], "first_error", threshold=0.7) == 0.5  # 0.6 < 0.7: k = 2 of 2 → 1/2
    assert graded_value([1, 1]) == 1.0 and graded_value([0, 1]) == 0.0  # no wrong step: 1; first step wrong: 0
    assert graded_value([1, 0], scale=0.5) == 0.25 and graded_value([]) is None


def test_split_into_steps_caps_and_keeps_the_tail():
    assert split_into_steps("a\nb\nc\nd", "lines", 2) == ["a", "b\nc\nd"]
    assert split_into_steps("a\n\nb", "lines", 8) == ["a", "b"]


def _judge(texts):
    """A stand-in step judge: a step holding "bad" is wrong, any other right (the reply after "Verdict:")."""
    return [" No" if "Step to check:\nbad" in t else " Yes" for t in texts]


def _batch(acc):
    b = make_batch(None, [0, 0, 0, 1, 1, 1], terms=[[a] for a in acc])
    b.reward_names = ["accuracy"]
    b.completions = ["ok\nok\nbad\nok", "bad\nok", "ok\nok", "ok\nbad", "ok", "bad"]
    return b


def test_stage_grades_only_all_negative_groups():
    """Group 0 is all wrong: rows get (3−1)/4 = 0.5, (1−1)/2 = 0, no wrong step 1. Group 1 has a correct row (1.0):
    its rewards stay [0, 1, 0]."""
    stage = StepwiseGradedNegatives(judge_options={"score_by": "parse"}, generate=_judge)
    out = stage(_batch([0, 0, 0, 0, 1, 0]), SimpleNamespace(step=1))
    assert out.reward.tolist() == [0.5, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert out.reward_names == ["accuracy", "sgpo"] and out.reward_weights.tolist() == [1.0, 0.0]
    assert out.term("sgpo").tolist() == [0.5, 0.0, 1.0, 0.0, 0.0, 0.0]
    s = out.stats
    assert s["sgpo/graded_groups"] == 1.0 and s["sgpo/graded_group_frac"] == 0.5
    assert s["sgpo/graded_reward_mean"] == pytest.approx(0.5)  # (0.5 + 0 + 1)/3
    assert s["sgpo/graded_reward_std"] == pytest.approx(0.5)  # std of 0.5, 0, 1 (Bessel): 0.5
    assert s["sgpo/judge_failures"] == 0.0 and s["sgpo/steps_mean"] == pytest.approx(8 / 3)  # 4 + 2 + 2 steps


def test_stage_keeps_unparsed_rows_and_grades_share():
    """The judge's reply has no verdict for row 1's steps: that row keeps its reward and counts as a failure."""

    def judge(texts):
        return ["?" if "Step to check:\nbad" in t and "Earlier steps:\n(none)" in t else _judge([t])[0] for t in texts]

    stage = StepwiseGradedNegatives(grade="share", judge_options={"score_by": "parse"}, generate=judge)
    out = stage(_batch([0, 0, 0, 1, 1, 1]), SimpleNamespace(step=1))
    assert out.reward.tolist() == [0.75, 0.0, 1.0, 1.0, 1.0, 1.0]  # row 0: 3 of 4 right; group 1 all correct
    assert out.stats["sgpo/judge_failures"] == 1.0 and out.stats["sgpo/graded_groups"] == 1.0


class _Steps:
    """A process term's step scores by completion."""

    def __init__(self, table):
        self.table = table

    def step_scores(self, prompt, completion):
        return self.table.get(completion)


def test_stage_reads_a_process_term():
    b = make_batch(None, [0, 0], terms=[[0.0], [0.0]])
    b.reward_names, b.completions = ["accuracy"], ["x", "y"]
    ctx = SimpleNamespace(reward_terms={"prm": _Steps({"x": [0.9, 0.2, 0.8], "y": [0.6]})}, step=1)
    out = StepwiseGradedNegatives(process_term="prm", threshold=0.5)(b, ctx)
    assert out.reward.tolist() == pytest.approx([1 / 3, 1.0])  # x: first wrong k = 2 of 3 → 1/3; y: none wrong
    # soft: x (0.9 + 0.9·0.2 + 0.9·0.2·0.8)/3 = (0.9 + 0.18 + 0.144)/3 = 0.408; y 0.6
    b = make_batch(None, [0, 0], terms=[[0.0], [0.0]])
    b.reward_names, b.completions = ["accuracy"], ["x", "y"]
    out = StepwiseGradedNegatives(process_term="prm")(b, ctx)
    assert out.reward.tolist() == pytest.approx([0.408, 0.6])


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="grade"):
        StepwiseGradedNegatives(grade="last", generate=_judge)
    with pytest.raises(ValueError, match="threshold"):
        StepwiseGradedNegatives(threshold=2.0, generate=_judge)
    with pytest.raises(ValueError, match="judge_model is not set"):
        StepwiseGradedNegatives()
    with pytest.raises(ValueError, match="process_term"):
        StepwiseGradedNegatives(process_term="prm", judge_model="initial")
    with pytest.raises(KeyError, match="outcome_term"):
        StepwiseGradedNegatives(outcome_term="acc", judge_options={"score_by": "parse"}, generate=_judge)(
            _batch([0] * 6), None
        )


@pytest.mark.long
def test_sgpo_trains_two_steps_and_grades_the_all_negative_groups(tiny_cfg):
    """The tiny model is never right: every group is all-negative and graded by the frozen initial policy's step
    verdicts (P(" Yes") vs P(" No"); continuous, so the grades differ within a group)."""
    cfg = tiny_cfg("algorithm=sgpo", "trainer.autocast=off", "trainer.num_generations=4")
    m = run(cfg).metrics
    assert m["sgpo/graded_groups"] >= 1 and m["sgpo/judge_failures"] == 0.0
    assert 0.0 < m["sgpo/graded_reward_mean"] < 1.0 and "reward/sgpo/mean" in m
    assert m["sgpo/graded_reward_std"] > 0 and m["advantage/abs_mean"] > 0  # the soft grades separate the group
    assert math.isfinite(m["loss/total"])
