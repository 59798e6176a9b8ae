"""Pairwise-RL's anchored preference reward (rlexp.algorithms.group_stages.anchor_pairwise): anchors from records,
P(response ≻ anchor) by hand with a stand-in pairwise judge (``generate=``), failures, bad settings, and two training
steps of algorithm=pairwise_rl on the tiny model (long)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rlexp.algorithms.group_stages.anchor_pairwise import AnchorPreference, record_anchor
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch


def test_record_anchor_prefers_the_worked_solution():
    rec = {"answer": "4", "metadata": {"solution": "2 + 2 = 4 #### 4"}}
    assert record_anchor(rec, ["metadata.solution", "answer"]) == "2 + 2 = 4 #### 4"
    assert record_anchor({"answer": 7, "metadata": {}}, ["metadata.solution", "answer"]) == "7"
    assert record_anchor({"answer": "  "}, ["answer"]) is None and record_anchor(None, ["answer"]) is None


def _judge(texts):
    """A stand-in judge: the answer holding "good" wins; two "good" or none: tie; "???" answers: no verdict.
    (The reply follows the "Verdict:" prefix.)"""
    out = []
    for t in texts:
        a = t.split("Answer A:\n")[1].split("\n\nAnswer B:")[0]
        b = t.split("Answer B:\n")[1].split("\n\nWhich")[0]
        if "???" in a + b:
            out.append(" hmm")
        elif ("good" in a) == ("good" in b):
            out.append(" tie")
        else:
            out.append(" A" if "good" in a else " B")
    return out


def _batch(completions, anchors):
    b = make_batch(None, [0, 0, 1, 1], terms=[[1.0], [0.0], [0.0], [1.0]])
    b.reward_names = ["accuracy"]
    b.completions = completions
    b.records = [{"question": "q", "answer": a} if a is not None else {"question": "q"} for a in anchors]
    return b


def test_preference_against_the_anchor_by_hand():
    """Both orders asked: row 0 "good" vs anchor "plain": A then B → (1 + 1 − 0)/2 = 1; row 1 "plain" vs "plain": tie
    both → 1/2; row 2 "plain" vs "good": (0 + 1 − 1)/2 = 0; row 3 "good" vs "good": 1/2. The preference replaces the
    reward."""
    stage = AnchorPreference(score_by="parse", generate=_judge)
    out = stage(_batch(["good", "plain", "plain", "good"], ["plain", "plain", "good", "good"]), SimpleNamespace())
    assert out.reward.tolist() == [1.0, 0.5, 0.0, 0.5]
    assert out.reward_names == ["accuracy", "pairwise"] and out.term("pairwise").tolist() == [1.0, 0.5, 0.0, 0.5]
    s = out.stats
    assert s["pairwise_rl/pref_mean"] == 0.5 and s["pairwise_rl/beats_anchor_frac"] == 0.25
    assert s["pairwise_rl/failures"] == 0.0 and s["pairwise_rl/judge_prompts"] == 6.0
    # 3 distinct pairs (row 2's is row 0's reversed: one cache entry) × 2 orders = 6 prompts
    # within-group std (Bessel) of [1, 1/2] and [0, 1/2]: both √(1/8) ≈ 0.3536
    assert s["pairwise_rl/pref_std"] == pytest.approx(math.sqrt(0.125), abs=1e-6)


def test_one_order_failures_and_added_column():
    """swap=false: one order only. Row 1 has no anchor, row 2's verdict does not parse: both score 1/2, failures 2.
    replace=false: the column is added at weight 0.5 to the accuracy total [1, 0, 0, 1]."""
    stage = AnchorPreference(score_by="parse", swap=False, replace=False, weight=0.5, generate=_judge)
    out = stage(_batch(["good", "good", "???", "plain"], ["plain", None, "x", "good"]), SimpleNamespace())
    assert out.term("pairwise").tolist() == [1.0, 0.5, 0.5, 0.0]
    assert out.reward.tolist() == [1.5, 0.25, 0.25, 1.0]
    assert out.stats["pairwise_rl/failures"] == 2.0 and out.stats["pairwise_rl/no_anchor"] == 1.0


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="score_by"):
        AnchorPreference(score_by="votes", generate=_judge)
    with pytest.raises(ValueError, match="failure_score"):
        AnchorPreference(score_by="parse", failure_score=2.0, generate=_judge)
    with pytest.raises(ValueError, match="judge_model is not set"):
        AnchorPreference()
    with pytest.raises(ValueError, match="anchor_keys"):
        AnchorPreference(score_by="parse", anchor_keys=[], generate=_judge)


@pytest.mark.long
def test_pairwise_rl_trains_two_steps_on_the_anchor_preference(tiny_cfg):
    """The frozen initial policy reads P(" A") vs P(" B") for (completion, gold answer) in both orders: continuous
    preferences that differ within a group, so GRPO has a signal."""
    cfg = tiny_cfg("algorithm=pairwise_rl", "trainer.autocast=off", "trainer.num_generations=4")
    m = run(cfg).metrics
    assert m["pairwise_rl/failures"] == 0.0 and m["pairwise_rl/judge_prompts"] > 0
    assert 0.0 < m["pairwise_rl/pref_mean"] < 1.0 and m["pairwise_rl/pref_std"] > 0
    assert "reward/pairwise/mean" in m and m["advantage/abs_mean"] > 0 and math.isfinite(m["loss/total"])
