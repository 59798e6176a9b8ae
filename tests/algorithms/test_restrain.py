"""RESTRAIN's label-free advantage and the answer-vote stage, worked by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.self_consistency import pseudo_label_weights, restrain
from rlexp.algorithms.group_stages.votes import AnswerVotes, cluster_answers
from rlexp.core.masks import ANSWER_CLUSTER, ANSWER_SHARE
from tests.algorithms.batches import make_batch


def test_clusters_by_math_equivalence():
    assert cluster_answers(["3", "3.0", "4", None, "4"]) == [0, 0, 1, -1, 1]


def test_pseudo_label_weights_by_hand():
    # raw: exp(-0.25/0.5) = 0.60653, exp(-0.5625/0.5) = 0.32465 (twice); total 1.25583
    assert pseudo_label_weights([0.5, 0.25, 0.25], 0.5) == pytest.approx([0.48297, 0.25851, 0.25851], abs=1e-5)


def _voted(clusters, groups):
    b = make_batch([0.0] * len(groups), groups)
    b.extras[ANSWER_CLUSTER] = torch.tensor(clusters)
    return b


def test_weighted_pseudo_labels_by_hand():
    b = _voted([0, 0, 1, -1], [0, 0, 0, 0])
    adv = restrain(b, sigma=0.5, kappa=2, delta=0.5, eps=0.0)
    # shares 0.5 / 0.25 -> w = 0.65136 / 0.34864; A^0 = ±0.86603 (labels [1,1,0,0]); A^1 = [-.5,-.5,1.5,-.5]
    expected = [0.38978, 0.38978, -0.04114, -0.73842]
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-4, rtol=0)
    assert b.stats["restrain/majority_weight_mean"] == pytest.approx(0.65136, abs=1e-5)
    assert b.stats["restrain/penalised_group_frac"] == 0.0


def test_low_agreement_groups_are_penalised():
    b = _voted([0, 0, 1, -1, -1, -1, -1, -1], [0, 0, 0, 0, 1, 1, 1, 1])
    adv = restrain(b, kappa=3, delta=0.5)  # group 0's majority holds 2 < 3; group 1 has no answer at all
    assert adv.tolist() == [-0.5] * 8 and b.stats["restrain/penalised_group_frac"] == 1.0
    assert math.isnan(b.stats["restrain/majority_weight_mean"])


def test_one_answer_everywhere_is_ttrl_and_errors_name_the_setting():
    b = _voted([0, 0, 0, -1], [0, 0, 0, 0])  # a single pseudo-label: weight 1 (TTRL's majority reward, normalised)
    adv = restrain(b, kappa=1, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.5, 0.5, -1.5]))
    with pytest.raises(KeyError, match="AnswerVotes"):
        restrain(make_batch([0.0, 1.0], [0, 0]))
    with pytest.raises(ValueError, match="sigma > 0"):
        restrain(b, sigma=0.0)


def test_answer_votes_stage_logs_agreement_and_pseudo_label_accuracy():
    b = make_batch([0.0] * 6, [0, 0, 0, 1, 1, 1])
    b.completions = ["2 + 1 = 3\n#### 3", "#### 3.0", "#### 4", "#### 7", "no idea", "#### 8"]
    b.records = [{"id": "a", "question": "q", "answer": "3", "scorer": "math"}] * 3 + [
        {"id": "b", "question": "r", "answer": "9", "scorer": "math"}
    ] * 3
    AnswerVotes(fallback_last_number=False)(b, SimpleNamespace(answer_format="hash"))
    assert b.extras[ANSWER_CLUSTER].tolist() == [0, 0, 1, 0, -1, 1]
    assert b.extras[ANSWER_SHARE].tolist() == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3, 0.0, 1 / 3])
    # majorities: "3" (2 of 3, right), "7" (1 of 3, a tie broken by first seen; wrong)
    assert b.stats["votes/majority_share_mean"] == pytest.approx(0.5)
    assert b.stats["votes/pseudo_label_accuracy"] == 0.5 and b.stats["votes/no_answer_group_frac"] == 0.0


def test_a_label_free_config_refuses_a_run_without_its_vote_reward():
    b = make_batch([1.0, 0.0], [0, 0])
    with pytest.raises(KeyError, match="require_term='majority'.*reward=majority_vote"):
        AnswerVotes(require_term="majority")(b, SimpleNamespace(answer_format="hash"))
