"""PVPO: the reference anchor (cached, first sight only), the filter of prompts the reference always solves, the
advantage r − anchor, and a two-step run of algorithm=pvpo."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.prompt_value import anchored
from rlexp.algorithms.group_stages.prompt_values import ReferenceAnchor


class _FakeBatch(SimpleNamespace):
    def __len__(self):
        return len(self.records)

    def select(self, idx):
        idx = idx.tolist()
        return _FakeBatch(
            reward=self.reward[idx],
            records=[self.records[i] for i in idx],
            extras={k: v[idx] for k, v in self.extras.items()},
            stats=dict(self.stats),
        )


class _Counting(ReferenceAnchor):
    """The reference rollouts replaced by given per-prompt means (counts the prompts estimated)."""

    def __init__(self, means, **kw):
        super().__init__(**kw)
        self.means, self.estimated = means, []

    def _estimate(self, batch, ctx, firsts):
        for i in firsts:
            key = batch.records[i]["id"]
            self.estimated.append(key)
            self.anchors[key] = self.means[key]


def _batch(ids, rewards):
    return _FakeBatch(
        reward=torch.tensor(rewards, dtype=torch.float32), records=[{"id": i} for i in ids], extras={}, stats={}
    )


def test_anchor_cached_filter_and_advantage_by_hand():
    stage = _Counting({"a": 0.25, "b": 1.0, "c": 0.0})
    # rows: a, a, b, b, c, c — b is always solved by the reference: dropped; c (never solved) kept by default
    out = stage(_batch(["a", "a", "b", "b", "c", "c"], [1.0, 0.0, 1.0, 1.0, 0.5, 0.0]))
    assert stage.estimated == ["a", "b", "c"]
    assert [r["id"] for r in out.records] == ["a", "a", "c", "c"]
    assert out.stats["pvpo/dropped_share"] == pytest.approx(2 / 6)
    assert out.stats["pvpo/anchor_mean"] == pytest.approx((0.25 * 2 + 1.0 * 2 + 0.0 * 2) / 6)
    # A = r − anchor: [1 − 0.25, 0 − 0.25, 0.5 − 0, 0 − 0]
    assert anchored(out).tolist() == pytest.approx([0.75, -0.25, 0.5, 0.0])
    # second sight: cached, no new estimate
    stage(_batch(["a", "a"], [0.0, 0.0]))
    assert stage.estimated == ["a", "b", "c"]
    restored = ReferenceAnchor()
    restored.load_state_dict(stage.state_dict())
    assert restored.anchors == {"a": 0.25, "b": 1.0, "c": 0.0}


def test_drop_unsolved_and_keep_all():
    stage = _Counting({"a": 0.25, "c": 0.0, "b": 1.0}, drop_unsolved=True)
    out = stage(_batch(["a", "c"], [1.0, 0.0]))
    assert [r["id"] for r in out.records] == ["a"]
    out = stage(_batch(["b", "c"], [1.0, 0.0]))  # everything would go: the step keeps it whole
    assert len(out) == 2 and out.stats["pvpo/kept_all"] == 1.0
    with pytest.raises(ValueError, match="samples"):
        ReferenceAnchor(samples=0)


@pytest.mark.long
def test_pvpo_two_steps(tiny_cfg):
    from rlexp.runs.training import run
    from tests.algorithms.varying_reward import VARYING

    result = run(
        tiny_cfg(
            *VARYING, "trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2", "algorithm=pvpo"
        )
    )
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"]) and m["advantage/abs_mean"] > 0
    assert m["pvpo/new_prompts"] >= 1 and 0.0 < m["pvpo/anchor_mean"] < 1.0
    assert "pvpo/dropped_share" in m
