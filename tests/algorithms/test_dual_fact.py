"""KLCF's group stage (rlexp.algorithms.group_stages.factuality.DualFactLog): requires the two rewards and logs their
per-completion F1, by hand."""

import pytest

from rlexp.algorithms.group_stages.factuality import DualFactLog
from tests.algorithms.batches import make_batch


def _batch(recall, precision):
    b = make_batch(None, [0] * len(recall), terms=[list(x) for x in zip(recall, precision)])
    b.reward_names = ["checklist_recall", "self_precision"]
    return b


def test_f1_and_shares_by_hand():
    # rows: (R, P) = (0.5, 0.5) -> F1 0.5; (1.0, 0.25) -> 2·0.25/1.25 = 0.4; (0, 0.8) -> 0; (0, 0) -> 0
    b = DualFactLog()(_batch([0.5, 1.0, 0.0, 0.0], [0.5, 0.25, 0.8, 0.0]), None)
    assert b.stats["klcf/f1_mean"] == pytest.approx((0.5 + 0.4) / 4)
    assert b.stats["klcf/zero_recall_frac"] == 0.5  # rows 3 and 4
    assert b.stats["klcf/low_precision_frac"] == 0.5  # rows 2 (0.25) and 4 (0)
    assert b.reward.tolist() == pytest.approx([1.0, 1.25, 0.8, 0.0])  # rewards untouched


def test_a_run_without_the_klcf_rewards_is_refused():
    b = make_batch([0.1, 0.2], [0, 0])
    with pytest.raises(KeyError, match="recall_term='checklist_recall'.*reward=klcf"):
        DualFactLog()(b, None)
