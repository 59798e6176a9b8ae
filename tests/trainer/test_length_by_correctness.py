"""``length/correct_mean`` and ``length/wrong_mean`` (rlexp.trainer.metrics): the mean completion length of the rows
the accuracy term scores 1 and 0 — Dr. GRPO's wrong-answer length growth (conf/experiment/dr_grpo_vs_grpo_smollm2)."""

from __future__ import annotations

import pytest

from rlexp.trainer.metrics import batch_metrics
from tests.algorithms.batches import make_batch


def test_lengths_split_by_the_accuracy_term():
    # accuracy t0 per row: 1, 0, 0.5 (partial credit: neither), 0; lengths 4, 6, 9, 10
    b = make_batch(None, [0, 0, 1, 1], lengths=[4, 6, 9, 10], terms=[[1, 1], [0, 1], [0.5, 0], [0, 0]])
    m = batch_metrics(b, "t0")
    assert m["length/correct_mean"] == pytest.approx(4.0)  # row 0
    assert m["length/wrong_mean"] == pytest.approx(8.0)  # rows 1 and 3: (6 + 10) / 2
    assert m["length/mean"] == pytest.approx(7.25)


def test_absent_when_no_such_row_or_no_accuracy_term():
    b = make_batch(None, [0, 0], lengths=[3, 5], terms=[[0, 1], [0, 0]])
    m = batch_metrics(b, "t0")
    assert "length/correct_mean" not in m and m["length/wrong_mean"] == pytest.approx(4.0)
    assert not {"length/correct_mean", "length/wrong_mean"} & set(batch_metrics(b, None))
