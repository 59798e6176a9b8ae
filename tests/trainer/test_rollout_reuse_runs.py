"""Issue 20 §4's rollout options under their experiment configs on the tiny model: SPEC-RL drafts from the
previous epoch's completions once prompts recur (and its cache survives a resume), Infinite Sampling decodes
each group in micro groups."""

from __future__ import annotations

import json

import pytest

from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

# a 2-prompt training split at 2 prompts per step: every step after the first sees the same prompts again
RECUR = [*VARYING, "dataset.train_size=2", "trainer.max_new_tokens=8", "optimizer.lr=1e-2", "trainer.autocast=off"]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_spec_rl_drafts_once_prompts_recur(tiny_cfg, tmp_path):
    run(tiny_cfg(*RECUR, "+experiment=spec_rl", "trainer.max_steps=3"))
    rows = _rows(tmp_path / "run")
    assert rows[0]["spec/drafted_frac"] == 0.0 and rows[0]["spec/reused_tokens_mean"] == 0.0
    for r in rows[1:]:  # the same two prompts again: every completion has a draft and reuses part of it
        assert r["spec/drafted_frac"] == 1.0 and r["spec/cache_prompts"] == 2.0
        assert 0 < r["spec/accepted_frac"] <= 1 and r["spec/reused_tokens_mean"] > 0
        assert r["time/spec_verify_s"] > 0 and r["time/generate_s"] > 0
    assert any(r["spec/accepted_frac"] < 1 for r in rows[1:])  # the policy moved: some drafts are cut


@pytest.mark.long
def test_spec_rl_cache_survives_a_resume(tiny_cfg, tmp_path):
    from tests.conftest import TINY, compose_train

    common = [*RECUR, "+experiment=spec_rl", "trainer.checkpoint_every=1"]
    run(tiny_cfg(*common, "trainer.max_steps=2"))
    resumed = run(tiny_cfg(*common, "trainer.max_steps=3")).metrics  # step 3 after a restart from step 2
    assert resumed["spec/drafted_frac"] == 1.0  # the cache came back with the checkpoint
    ref_dir = tmp_path / "ref"
    run(compose_train([*TINY, *common, "trainer.max_steps=3"], ref_dir))
    ref = _rows(ref_dir)[-1]
    for key in ("spec/accepted_frac", "spec/reused_tokens_mean", "loss/total", "length/mean"):
        assert resumed[key] == pytest.approx(ref[key], abs=1e-6), key  # as if never interrupted


def test_infinite_sampling_decodes_micro_groups(tiny_cfg):
    m = run(tiny_cfg(*VARYING, "+experiment=infinite_sampling", "trainer.max_new_tokens=6")).metrics
    assert m["rollout/micro_groups"] == 2.0  # G = 4 in rounds of 2
    assert m["rollout/kv_cache_mb"] > 0 and m["train/optimizer_steps"] >= 1
