"""Issue 20 §3 seed ratio methods under their own configs on the tiny model: each takes its update schedule (the
ratio leaves 1) and logs the metric that shows its mechanism acting."""

from __future__ import annotations

import math

import pytest

from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
MECHANISM = {
    "ce_gppo": ("ce_gppo/preserved_frac",),
    "aspo": ("aspo/weight_mean", "aspo/dual_clip_pos_frac", "aspo/dual_clip_neg_frac"),
    "gbpo": ("gbpo/abs_gap", "gbpo/target_ratio", "gbpo/above_median_frac"),
    "stable_reinforce": ("stable_reinforce/pre_clip_frac", "stable_reinforce/filtered_frac"),
}


@pytest.mark.parametrize("method", sorted(MECHANISM))
def test_seed_ratio_method_runs_off_policy_and_logs_its_mechanism(method, tiny_cfg):
    m = run(tiny_cfg(*VARYING, *FAST, f"algorithm={method}")).metrics
    assert m["train/optimizer_steps"] == 2.0  # the config's schedule, capped at the tiny step's 2 groups
    assert m["ratio/max"] != 1.0 or m["ratio/min"] != 1.0
    for name in MECHANISM[method]:
        assert name in m and math.isfinite(m[name]), name
    if method == "gbpo":
        assert m["gbpo/abs_gap"] > 0  # the ratio is regressed onto a target ratio off 1
    if method == "aspo":
        assert m["aspo/weight_mean"] > 0
