"""PROF's process-consistency filter (rlexp.algorithms.group_stages.process): the released rule by hand, the filter on
a hand-made batch, and two training steps of algorithm=prof on the tiny model (with a tiny random PRM, and with the
override the method runs test uses)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.process import ProcessConsistencyFilter, prof_keep
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch

# ---------------------------------------------------------------- the rule, by hand


def test_prof_keep_balances_correct_and_wrong():
    """n_remove = 4 of 8. 6 correct / 2 wrong: Δ = 4, round((4 + 4) / 2) = 4 correct removed (the lowest critic).
    2 correct / 6 wrong: Δ = −4, round(0 / 2) = 0: 4 wrong removed. 3 / 5: Δ = −2, 1 correct and 3 wrong."""
    critic = [0.5, -0.1, 0.3, 0.2, 0.9, -0.5, 0.0, 0.4]
    keep = prof_keep([0] * 8, [True] * 6 + [False] * 2, critic, lambda n: 4)
    assert keep == [0, 4, 6, 7]  # the correct rows 1, 5, 3, 2 (critic −0.1, −0.5, 0.2, 0.3) dropped
    keep = prof_keep([0] * 8, [True] * 2 + [False] * 6, critic, lambda n: 4)
    assert keep == [0, 1, 4, 7]  # the wrong rows 5, 6, 3, 2 (critic −0.5, 0, 0.2, 0.3) dropped
    keep = prof_keep([0] * 8, [True] * 3 + [False] * 5, critic, lambda n: 4)
    assert keep == [0, 2, 4, 7]  # correct row 1 (−0.1); wrong rows 5, 6, 3 (−0.5, 0, 0.2)


def test_prof_keep_per_group_all_correct_and_random_negatives():
    # group 0: 4 correct, remove 2 → the two lowest; group 1: 4 wrong, remove 2 at random (PROF-Correct)
    critic = [0.1, 0.4, 0.2, 0.3, 0.0, 0.0, 0.0, 0.0]
    keep = prof_keep([0] * 4 + [1] * 4, [True] * 4 + [False] * 4, critic, lambda n: 2, "random", random.Random(3))
    assert keep[:2] == [1, 3] and len(keep) == 4 and set(keep[2:]) <= {4, 5, 6, 7}
    assert prof_keep([0, 0], [True, False], [0.0, 0.0], lambda n: 0) == [0, 1]


class Steps:
    """A process term's side output: step scores by (prompt, completion)."""

    def __init__(self, table):
        self.table = table

    def step_scores(self, prompt, completion):
        return self.table.get(completion)


def _batch(correct, steps, prm_weight=0.0):
    n = len(correct)
    cols = [[float(c), sum(s) / len(s) if s else 0.0] for c, s in zip(correct, steps)]
    b = make_batch(None, [0] * n, terms=cols, weights=[1.0, prm_weight])
    b.reward_names = ["accuracy", "prm"]
    b.completions = [f"c{i}" for i in range(n)]
    ctx = SimpleNamespace(reward_terms={"prm": Steps(dict(zip(b.completions, steps)))}, step=1)
    return b, ctx


def test_filter_on_a_hand_made_group():
    """v̄ = (0.9 + 0.7 + 0.2 + 0.4 + 0.8 + 0.6 + 0.1 + 0.3) / 8 = 0.5. c = mean 2(v − 0.5)(2r − 1):
    row 0 (correct) (0.8 + 0.4)/2 = 0.6; row 1 (correct) (−0.6 − 0.2)/2 = −0.4; row 2 (wrong) −(0.6 + 0.2)/2 = −0.4;
    row 3 (wrong) (0.8 + 0.4)/2 = 0.6. Remove 2, Δ = 0: one correct (row 1) and one wrong (row 2)."""
    b, ctx = _batch([1, 1, 0, 0], [[0.9, 0.7], [0.2, 0.4], [0.8, 0.6], [0.1, 0.3]], prm_weight=1.0)
    out = ProcessConsistencyFilter()(b, ctx)
    assert out.completions == ["c0", "c3"]
    s = out.stats
    assert s["prof/dropped_frac"] == 0.5 and s["prof/consistency_mean"] == pytest.approx(0.1)
    assert s["prof/consistency_correct_mean"] == pytest.approx(0.1) and s["prof/kept_correct_frac"] == 0.5
    # PROF trains on the outcome only: the process term left the reward (column kept, weight 0)
    assert out.reward_weights.tolist() == [1.0, 0.0] and out.reward.tolist() == pytest.approx([1.0, 0.0])
    b, ctx = _batch([1, 1, 0, 0], [[0.9, 0.7], [0.2, 0.4], [0.8, 0.6], [0.1, 0.3]], prm_weight=1.0)
    assert ProcessConsistencyFilter(blend=True)(b, ctx).reward.tolist() == pytest.approx([1.8, 0.2])


def test_filter_penalises_step_counts_and_unscored_rows():
    """Row 0 is correct with the best PRM values but one step (< min_steps = 2): c − 10, dropped first; row 1 was not
    scored (no steps): c = 0, penalised too."""
    b, ctx = _batch([1, 1, 1, 0], [[0.99], None, [0.6, 0.6], [0.1, 0.1]])
    out = ProcessConsistencyFilter(remove=2)(b, ctx)
    assert out.completions == ["c2", "c3"] and out.stats["prof/penalised_frac"] == 0.5


def test_filter_falls_back_to_the_column_and_names_a_missing_term():
    b, _ = _batch([0, 0, 0, 0], [[0.9], [0.2], [0.8], [0.1]])
    out = ProcessConsistencyFilter()(b, SimpleNamespace(reward_terms={}, step=0))  # no step scores: the column
    assert out.completions == ["c1", "c3"]  # all wrong: the two with the highest PRM value dropped; no step penalty
    with pytest.raises(KeyError, match="process_term='judge'"):
        ProcessConsistencyFilter(process_term="judge")(b, None)
    with pytest.raises(ValueError, match="negatives='all'"):
        ProcessConsistencyFilter(negatives="all")


# ---------------------------------------------------------------- two steps on the tiny model


VOWELS = "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare"
FAST = ["trainer.autocast=off", "trainer.max_new_tokens=8", "trainer.device=cpu"]


def test_prof_trains_two_steps_with_a_tiny_prm(tiny_cfg, prm_path):
    result = run(
        tiny_cfg(
            "algorithm=prof",
            "reward=accuracy_prm",
            VOWELS,
            *FAST,
            f"reward.terms.prm.model={prm_path}",
            "reward.terms.prm.split=lines",
            "algorithm.group_stages.0.correct_min=0.4",  # the vowel share (~0.4 here) counts as correct from 0.4
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    assert m["prof/dropped_frac"] == 0.5  # 2 of each group of 4
    assert m["reward/prm/failures"] == 0.0 and 0.0 <= m["reward/prm/mean"] <= 1.0


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_prof_runs_with_the_method_tests_overrides(tiny_cfg):
    """What tests/algorithms/test_methods_run.py needs for algorithm=prof (reward=accuracy has no process term): the
    varying reward as the process term's column, and groups of 4 so that 2 rows stay in each group."""
    result = run(
        tiny_cfg(
            "reward=accuracy",
            VOWELS,
            "trainer.autocast=off",
            "trainer.max_new_tokens=6",
            "algorithm=prof",
            "+reward.terms.prm._target_=tests.algorithms.varying_reward.VowelShare",
            "trainer.num_generations=4",
        )
    )
    m = result.metrics
    assert result.last_step == 2 and m["prof/dropped_frac"] == 0.5 and m["advantage/abs_mean"] > 0
    assert torch.isfinite(torch.tensor(m["loss/total"]))
