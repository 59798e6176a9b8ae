"""The verdict language by hand: each comparison on per-seed values worked out in the comments."""

from __future__ import annotations

import math

import pytest

from rlexp.reproduce.spec import Check
from rlexp.reproduce.verdict import (
    FAIL,
    HELD,
    NOT_HELD,
    NOT_TESTABLE,
    PASS,
    UNTESTABLE,
    Values,
    evaluate,
    evaluate_check,
    pooled_std,
)

# arm a: length 10, 12 (mean 11, std sqrt(2) ≈ 1.414); arm b: 20, 20 (mean 20, std 0);
# accuracy a: 0.30, 0.34 (mean 0.32, std 0.028284); b: 0.36, 0.40 (mean 0.38, std 0.028284)
VALUES = Values(
    final={
        ("a", "length"): [10.0, 12.0],
        ("b", "length"): [20.0, 20.0],
        ("a", "acc"): [0.30, 0.34],
        ("b", "acc"): [0.36, 0.40],
        ("c", "acc"): [0.5],  # one seed only
        ("z", "length"): [0.0, 0.0],
    },
    growth={("b", "length"): [2.0, 1.0]},  # last/first per run: mean 1.5
)


def check(kind, arm="a", vs=None, low=None, high=None, metric="length"):
    return Check(metric, arm, kind, vs, low, high)


def test_pooled_std():
    assert pooled_std(3.0, 4.0) == pytest.approx(math.sqrt(12.5))  # sqrt((9 + 16) / 2)


@pytest.mark.parametrize(
    "c, value, status",
    [
        (check("value", low=11), 11.0, PASS),  # mean(10, 12) = 11 >= 11 (inclusive)
        (check("value", high=10.9), 11.0, FAIL),
        (check("ratio", vs="b", high=0.55), 0.55, PASS),  # 11 / 20 = 0.55 <= 0.55
        (check("ratio", vs="b", high=0.5), 0.55, FAIL),
        (check("difference", vs="b", low=-9, high=-9), -9.0, PASS),  # 11 - 20 = -9
        (check("growth", arm="b", low=1.5), 1.5, PASS),  # mean(2, 1) = 1.5
        (check("growth", arm="b", high=1.2), 1.5, FAIL),
    ],
)
def test_single_comparisons(c, value, status):
    o = evaluate_check(c, VALUES)
    assert o.value == pytest.approx(value) and o.status == status


def test_std_comparisons():
    # acc: d = 0.32 - 0.38 = -0.06; pooled std = sqrt((0.028284² + 0.028284²)/2) = 0.028284; d/s = -2.1213
    o = evaluate_check(check("difference_in_std", vs="b", low=-1, metric="acc"), VALUES)
    assert o.value == pytest.approx(-0.06 / 0.0282843, rel=1e-4) and o.status == FAIL
    o = evaluate_check(check("difference_in_std", vs="b", low=-2.2, metric="acc"), VALUES)
    assert o.status == PASS
    # within_std k: |d| / s = 2.1213 <= k
    assert evaluate_check(check("within_std", vs="b", high=2.2, metric="acc"), VALUES).status == PASS
    assert evaluate_check(check("within_std", vs="b", high=2.0, metric="acc"), VALUES).status == FAIL
    # length: s = sqrt((2 + 0) / 2) = 1; d = -9 → -9 std
    assert evaluate_check(check("difference_in_std", vs="b", high=-9), VALUES).value == pytest.approx(-9.0)


@pytest.mark.parametrize(
    "c, reason",
    [
        (check("value", arm="b", metric="acc2"), "acc2 has no value for arm b"),
        (check("ratio", vs="z"), "length of z is 0: no ratio"),
        (check("within_std", arm="c", vs="b", high=1, metric="acc"), "needs ≥ 2 runs of c"),
        (check("growth", arm="a"), "length has no first and last values for arm a"),
    ],
)
def test_what_cannot_be_computed_is_untestable(c, reason):
    o = evaluate_check(c, VALUES)
    assert o.status == UNTESTABLE and reason in o.reason


def test_the_verdict():
    shorter = Check("length", "a", "ratio", "b", None, 0.7, "length falls by ≥ 30 %")  # 0.55: holds
    kept = Check("acc", "a", "difference_in_std", "b", -1, None, "accuracy kept")  # -2.12 std: fails
    room = Check("length", "b", "value", None, 15, None, "room to shorten")  # 20 >= 15: holds
    no_room = Check("length", "b", "value", None, 25, None, "room to shorten")  # 20 < 25
    assert evaluate([room], [shorter], VALUES).result == HELD
    v = evaluate([room], [shorter, kept], VALUES)
    assert v.result == NOT_HELD and v.why.startswith("accuracy kept: acc a − b = -0.06")
    v = evaluate([no_room], [shorter], VALUES)
    assert v.result == NOT_TESTABLE and v.why.startswith("needs room to shorten (length of b = 20")
    one_seed = Check("acc", "c", "within_std", "b", None, 1.0)
    v = evaluate([room], [shorter, one_seed], VALUES)
    assert v.result == NOT_TESTABLE and "needs ≥ 2 runs of c" in v.why
