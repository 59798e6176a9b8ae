"""KnowRL (algorithm=knowrl view=self_knowledge reward=self_knowledge): the judgment-vote stage worked by hand and a
two-step run on the tiny model whose completions are scripted judgments."""

import math
from types import SimpleNamespace

import pytest

from rlexp.algorithms.group_stages.self_knowledge import FeasibilityVotes, judgment_f1
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch


def _rec(label):
    return {"id": "r", "question": "q", "answer": label or "?", "metadata": {"feasibility": label} if label else {}}


def test_f1_takes_infeasible_as_the_positive_class():
    # TP 1 (second), FP 1 (first), FN 1 (third, no judgment): 2 / (2 + 1 + 1)
    assert judgment_f1(["infeasible", "infeasible", None], ["feasible", "infeasible", "infeasible"]) == 0.5
    assert math.isnan(judgment_f1(["feasible"], ["feasible"]))


def test_stage_logs_consensus_and_the_hidden_label_by_hand():
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    b = make_batch([0.0] * 10, groups)
    b.reward_names = ["consensus"]
    b.completions = [
        *("#### feasible", "#### feasible", "#### infeasible", "no idea"),  # F F I -: consensus F, 2 of 4
        *("#### infeasible", "#### infeasible", "#### infeasible", "#### feasible"),  # consensus I, 3 of 4
        *("blah", "#### 12"),  # no judgment
    ]
    b.records = [_rec("feasible")] * 4 + [_rec("infeasible")] * 4 + [_rec(None)] * 2
    FeasibilityVotes()(b, SimpleNamespace(answer_format="hash"))
    s = b.stats
    assert s["self_knowledge/consensus_share_mean"] == pytest.approx((0.5 + 0.75) / 2)
    assert s["self_knowledge/no_consensus_frac"] == pytest.approx(1 / 3)  # group 2
    assert s["self_knowledge/judged_frac"] == pytest.approx(7 / 10)
    assert s["self_knowledge/feasible_frac"] == pytest.approx(3 / 7)
    # labelled rows: group 0 right 2 of 4 (F F), group 1 right 3 of 4 (I I I): 5 / 8
    assert s["self_knowledge/judgment_accuracy"] == pytest.approx(5 / 8)
    # TP 3 (group 1), FP 1 (group 0's I), FN 1 (group 1's F): 6 / 8
    assert s["self_knowledge/judgment_f1"] == pytest.approx(0.75)
    assert s["self_knowledge/consensus_accuracy"] == 1.0


def test_stage_without_judgments_or_labels_logs_nan_and_refuses_a_run_without_the_consensus_term():
    b = make_batch([0.0, 0.0], [0, 0])
    b.reward_names = ["consensus"]
    b.completions = ["x", "y"]
    FeasibilityVotes()(b, SimpleNamespace(answer_format="hash"))
    assert math.isnan(b.stats["self_knowledge/consensus_share_mean"])
    assert math.isnan(b.stats["self_knowledge/judgment_accuracy"]) and b.stats["self_knowledge/judged_frac"] == 0.0
    with pytest.raises(KeyError, match="require_term='consensus'.*reward=self_knowledge"):
        FeasibilityVotes()(make_batch([1.0], [0]), SimpleNamespace(answer_format="hash"))


SCRIPT = ["#### feasible", "I could.\n#### Feasible", "#### infeasible", "no judgment"]


class ScriptedJudgments(HFRollout):
    """The tiny model writes no words: its sampled texts are replaced by ``SCRIPT``, one line per completion of a
    group (the tokens stay the model's, so the update is a real one)."""

    def generate(self, model, tokenizer, prompts, num_generations=1, **kwargs):
        out = super().generate(model, tokenizer, prompts, num_generations, **kwargs)
        out.texts = [SCRIPT[i % num_generations % len(SCRIPT)] for i in range(len(out.texts))]
        return out


def test_knowrl_trains_two_steps_on_its_consensus(tiny_cfg):
    cfg = tiny_cfg(
        "algorithm=knowrl",
        "view=self_knowledge",
        "reward=self_knowledge",
        "rollout._target_=tests.algorithms.test_knowrl.ScriptedJudgments",
        "trainer.autocast=off",
        "trainer.max_new_tokens=6",
    )
    m = run(cfg).metrics
    assert math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    # every group: F F I - -> consensus F held by 2 of 4; the F judgments score 1
    assert m["reward/consensus/mean"] == 0.5 and m["self_knowledge/consensus_share_mean"] == 0.5
    assert m["self_knowledge/no_consensus_frac"] == 0.0 and m["self_knowledge/judged_frac"] == 0.75
    # the hidden labels of the step's 2 prompts decide these (for the log only): 0.5 (feasible), 0.25 (infeasible)
    assert m["self_knowledge/judgment_accuracy"] in (0.25, 0.375, 0.5)
    assert m["reward/accuracy/mean"] == m["self_knowledge/judgment_accuracy"]
    assert "self_knowledge/judgment_f1" in m and "self_knowledge/consensus_accuracy" in m
