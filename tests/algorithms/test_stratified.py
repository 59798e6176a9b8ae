"""Stratified GRPO's SAN advantage (rlexp/algorithms/advantages/stratified.py), worked by hand."""

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.advantages.stratified import strata_by_count, stratified
from tests.algorithms.batches import make_batch


def _batch():
    # one group of 4: two completions made one search call (stratum 1), two none (stratum 0)
    b = make_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0])
    b.completions = ["<search>a</search> 1", "<search>b</search> 0", "x", "y"]
    return b


def test_strata_count_matches_and_cap():
    assert strata_by_count(["<search><search><search>", "", "<search>"], "<search>", 2).tolist() == [2, 0, 1]


def test_san_blend_by_hand():
    b = _batch()
    adv = stratified(b, blend=0.5)
    # group: mean 0.75, Bessel std 0.5 -> A_G = [0.5, -1.5, 0.5, 0.5]
    # stratum 1: mean 0.5, std sqrt(0.5) -> A_S = [0.7071, -0.7071]; stratum 0: rewards equal -> 0
    a_s = torch.tensor([0.5**0.5, -(0.5**0.5), 0.0, 0.0])
    a_g = torch.tensor([0.5, -1.5, 0.5, 0.5])
    torch.testing.assert_close(adv, 0.5 * a_s + 0.5 * a_g, atol=1e-5, rtol=0)
    # |mean_k − mean_group| = 0.25 for every row
    assert b.stats["stratified/cross_stratum_bias_abs"] == pytest.approx(0.25)
    assert b.stats["stratified/strata_per_group"] == 2.0


def test_blend_zero_is_grpo_and_one_stratum_is_grpo():
    b = _batch()
    torch.testing.assert_close(stratified(b, blend=0.0), grpo(b))
    plain = make_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0])  # no search calls: one stratum
    torch.testing.assert_close(stratified(plain, blend=1.0), grpo(plain))


def test_strata_are_per_group():
    b = make_batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1])
    b.completions = ["<search>", "<search>", "<search>", "<search>"]
    # same stratum in each group: SAN = GRPO per group, not pooled across groups
    torch.testing.assert_close(stratified(b, blend=1.0), grpo(b))


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="algorithm.advantage.blend"):
        stratified(_batch(), blend=1.5)
    with pytest.raises(ValueError, match="max_stratum"):
        stratified(_batch(), max_stratum=-1)
