"""Group invariant learning (rlexp/algorithms/group_stages/group_invariant.py): the variance-maximising split, the
group-DRO step, the per-row loss and KL weights — by hand — the stage over two steps of hand-made batches, the
aggregation guard, and a two-step tiny run (conf/algorithm/group_invariant.yaml)."""

from __future__ import annotations

import math

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from rlexp.algorithms.group_stages.group_invariant import (
    GroupInvariant,
    dro_update,
    kl_multipliers,
    row_weights,
    variance_split,
)
from rlexp.config.paths import CONF_DIR
from rlexp.core.masks import KL_ROW_WEIGHTS, LOSS_MASK
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


# ---------------------------------------------------------------- the parts, by hand


def test_the_split_maximises_the_between_group_variance():
    # 0.1, 0.2 | 0.8, 0.9: 0.25·(0.15 − 0.85)² = 0.1225 beats 0.1875·(0.1 − 0.633)² = 0.0533 at either end -> 0.5
    assert variance_split([0.9, 0.1, 0.8, 0.2]) == pytest.approx(0.5)
    # 0, 0.1, 0.2 | 1: cuts score 0.0352, 0.0756, 0.1519 -> between 0.2 and 1.0 -> 0.6
    assert variance_split([0.0, 0.1, 0.2, 1.0]) == pytest.approx(0.6)
    assert variance_split([0.0, 0.0, 1.0]) == pytest.approx(0.5)
    assert variance_split([0.3, 0.3]) is None and variance_split([]) is None


def test_one_dro_step_on_known_group_rewards():
    # ℓ = −r, η = 1: hard ∝ 0.5·e^−0.2, easy ∝ 0.5·e^−0.8 -> hard = 1 / (1 + e^−0.6) = 0.645656
    q = dro_update({"hard": 0.5, "easy": 0.5}, {"hard": -0.2, "easy": -0.8}, 1.0)
    assert q["hard"] == pytest.approx(1 / (1 + math.exp(-0.6))) and q["easy"] == pytest.approx(0.354344, abs=1e-6)
    # a group absent from the step keeps its weight; the present ones share theirs (0.8) as above
    q = dro_update({"hard": 0.4, "easy": 0.4, "x": 0.2}, {"hard": -0.2, "easy": -0.8}, 1.0)
    assert q["x"] == pytest.approx(0.2) and q["hard"] == pytest.approx(0.8 * 0.645656, abs=1e-6)
    assert dro_update({"a": 1.0}, {}, 1.0) == {"a": 1.0}


def test_row_weights_make_the_loss_the_weighted_group_means():
    # tokens 3, 1 (hard) and 2, 2 (easy): N = 8, N_hard = N_easy = 4; q 0.75 / 0.25 -> 0.75·8/4 = 1.5, 0.25·8/4 = 0.5
    w = row_weights(["hard", "hard", "easy", "easy"], [3, 1, 2, 2], {"hard": 0.75, "easy": 0.25})
    assert w == pytest.approx([1.5, 1.5, 0.5, 0.5])
    # Σ w·tokens = N: the token-mean normaliser is unchanged; equal weights to the token shares give 1
    assert sum(a * t for a, t in zip(w, [3, 1, 2, 2])) == pytest.approx(8)
    assert row_weights(["a", "b"], [3, 1], {"a": 0.75, "b": 0.25}) == pytest.approx([1.0, 1.0])
    # q renormalised over the groups present: 0.5 / 0.3 of 0.8 -> 0.625, 0.375
    w = row_weights(["h", "e"], [1, 1], {"h": 0.5, "e": 0.3, "x": 0.2})
    assert w == pytest.approx([0.625 * 2, 0.375 * 2])


def test_the_kl_weighs_more_on_the_easy_group():
    # r̄ 0.2 and 0.8, mean 0.5, κ = 1: e^−0.3 and e^0.3
    m = kl_multipliers({"hard": 0.2, "easy": 0.8}, 1.0)
    assert m["hard"] == pytest.approx(0.740818, abs=1e-6) and m["easy"] == pytest.approx(1.349859, abs=1e-6)
    assert kl_multipliers({"hard": 0.2, "easy": 0.8}, 0.0) == {"hard": 1.0, "easy": 1.0}


# ---------------------------------------------------------------- the stage


def _batch(rewards, ids, lengths=None):
    batch = make_batch(rewards, [i // 2 for i in range(len(rewards))], lengths=lengths, width=4)
    batch.records = [{"id": ids[i // 2], "question": f"q{ids[i // 2]}", "answer": "1"} for i in range(len(rewards))]
    return batch


def test_the_stage_splits_weights_and_remembers():
    stage = GroupInvariant(step_size=1.0, kl_adapt=1.0)
    # prompt a: rewards 0, 0.4 (mean 0.2); b: 0.6, 1.0 (mean 0.8); tokens 3, 1 | 2, 2
    out = stage(_batch([0.0, 0.4, 0.6, 1.0], ["a", "b"], lengths=[3, 1, 2, 2]), None)
    s = out.stats
    assert s["gil/threshold"] == pytest.approx(0.5)  # a hard, b easy
    q_hard = 1 / (1 + math.exp(-0.6))
    assert s["gil/weight/hard"] == pytest.approx(q_hard) and s["gil/weight/easy"] == pytest.approx(1 - q_hard)
    assert s["gil/worst_group_reward"] == pytest.approx(0.2) and s["gil/groups"] == 2.0
    assert s["gil/reward/hard"] == pytest.approx(0.2) and s["gil/reward/easy"] == pytest.approx(0.8)
    # loss weights q·N/N_g with N = 8, N_g = 4 each; KL weights e^∓0.3
    w = out.extras[LOSS_MASK]
    assert w.tolist() == pytest.approx([2 * q_hard] * 2 + [2 * (1 - q_hard)] * 2)
    assert out.extras[KL_ROW_WEIGHTS].tolist() == pytest.approx([math.exp(-0.3)] * 2 + [math.exp(0.3)] * 2)
    assert s["gil/kl_weight/easy"] == pytest.approx(math.exp(0.3))
    # step 2: a again (now 0.6, 0.6 -> history (0.2 + 0.6)/2 = 0.4) and c (0.9): histories 0.4, 0.8, 0.9 -> the split
    # (0.4 | 0.8, 0.9) keeps a hard; c joins b as easy. Rewards 0.6 (hard) and 0.9 (easy): the DRO step from the
    # weights above moves the hard weight up by e^(0.9 − 0.6)
    out = stage(_batch([0.6, 0.6, 0.9, 0.9], ["a", "c"]), None)
    assert stage.history["a"] == [2.0, pytest.approx(0.4)] and out.stats["gil/threshold"] == pytest.approx(0.6)
    ratio = q_hard / (1 - q_hard) * math.exp(0.3)
    assert out.stats["gil/weight/hard"] == pytest.approx(ratio / (1 + ratio))
    # the state goes to checkpoints
    other = GroupInvariant()
    other.load_state_dict(stage.state_dict())
    assert other.weights == pytest.approx(stage.weights) and other.history == stage.history


def test_an_earlier_loss_weight_is_kept_and_one_distribution_is_one_group():
    batch = _batch([0.0, 1.0, 0.0, 1.0], ["a", "b"])
    batch.extras[LOSS_MASK] = torch.tensor([1.0, 0.0, 1.0, 1.0])  # an earlier stage dropped row 1
    for r in batch.records:
        r["metadata"] = {"source_dataset": "arith"}
    out = GroupInvariant(partition="distribution")(batch, None)
    assert out.stats["gil/groups"] == 1.0 and out.stats["gil/weight/arith"] == pytest.approx(1.0)
    assert out.extras[LOSS_MASK].tolist() == pytest.approx([1.0, 0.0, 1.0, 1.0])  # one group: weight 1
    assert out.extras[KL_ROW_WEIGHTS].tolist() == pytest.approx([1.0] * 4)
    # two distributions: each its own group
    batch = _batch([0.0, 0.0, 1.0, 1.0], ["a", "b"])
    batch.records = [{**r, "metadata": {"source_dataset": d}} for r, d in zip(batch.records, "xxyy")]
    out = GroupInvariant(partition="distribution", step_size=1.0)(batch, None)
    assert out.stats["gil/weight/x"] == pytest.approx(1 / (1 + math.exp(-1.0)))


@pytest.mark.parametrize(
    "kwargs, match",
    [({"partition": "kmeans"}, "partition"), ({"step_size": -1.0}, "step_size"), ({"kl_adapt": -1.0}, "kl_adapt")],
)
def test_bad_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupInvariant(**kwargs)


def _algorithm(*overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=["algorithm=group_invariant", "model=tiny", *overrides])
    try:
        return instantiate(cfg.algorithm, _convert_="all")
    finally:
        GlobalHydra.instance().clear()


def test_the_method_passes_the_kl_weights_and_refuses_per_sequence_means():
    algo = _algorithm()
    assert KL_ROW_WEIGHTS in algo.token_loss_extras
    with pytest.raises(Exception, match="algorithm.aggregation=token-mean"):
        _algorithm("algorithm.aggregation=seq-mean-token-mean")


# ---------------------------------------------------------------- two steps on the tiny model


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_group_invariant_trains_two_steps_toward_the_hard_group(tiny_cfg):
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=group_invariant"))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"])
    # step 1 splits its two prompts into hard and easy; the DRO step raises the hard group's weight
    assert m["gil/weight/hard"] > m["gil/weight/easy"] > 0
    assert 0.0 <= m["gil/worst_group_reward"] <= 1.0 and m["kl/mean"] > 0
