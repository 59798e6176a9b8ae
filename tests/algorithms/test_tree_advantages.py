"""Tree advantages (rlexp/algorithms/advantages/tree.py) on hand-drawn trees with the values worked out by hand:
TreePO's subgroup-aggregated advantage, TreeRL's global + local step reward over √|L|, SPO-tree's segment advantages
(children's-mean values, split copies, zero segments and the probability mask dropped, weighted whitening); then each
method trains two steps on the tiny model with its tree rollout (long)."""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.algorithms.advantages.tree import (
    GroupTree,
    child_mean_values,
    leaf_mean_values,
    spo_tree,
    token_nodes,
    treepo,
    treerl,
    weighted_whiten,
)
from rlexp.core.masks import TOKEN_LOSS_MASK
from rlexp.runs.training import run
from tests.algorithms.batches import make_batch
from tests.algorithms.varying_reward import VARYING

# T1, one prompt, four leaves (node ids; each node 2 tokens, f 1 token):
#   root ─┬─ a(1) ─┬─ c(3)  leaf 0, r = 1      tokens 0-1: a, 2-3: c
#         │        └─ d(4)  leaf 1, r = 0
#         └─ b(2) ─┬─ e(5)  leaf 2, r = 1
#                  └─ f(6)  leaf 3, r = 1      3 tokens
T1_PATHS = [[1, 3], [1, 4], [2, 5], [2, 6]]
T1_ENDS = [[2, 4], [2, 4], [2, 4], [2, 3]]
T1_REWARDS = [1.0, 0.0, 1.0, 1.0]


def tree_batch(rewards, paths, ends, groups=None):
    lengths = [e[-1] for e in ends]
    batch = make_batch(rewards, groups or [0] * len(rewards), lengths=lengths)
    for k, rec in enumerate(batch.records):
        rec["episode"] = {"tree": {"leaf": k, "nodes": paths[k], "ends": ends[k]}}
    return batch


def test_group_tree_rebuilds_parents_children_and_leaves():
    tree = GroupTree([0, 1, 2, 3], T1_PATHS, T1_ENDS)
    assert tree.parent == {1: 0, 3: 1, 4: 1, 2: 0, 5: 2, 6: 2}
    assert tree.children[0] == [1, 2] and tree.children[1] == [3, 4]
    assert tree.leaves[0] == [0, 1, 2, 3] and tree.leaves[1] == [0, 1] and tree.leaves[6] == [3]
    assert token_nodes([2, 4], 5).tolist() == [0, 0, 1, 1, 1]  # past the last end: the last node
    with pytest.raises(ValueError, match="parent"):
        GroupTree([0, 1], [[1, 2], [3, 2]], [[1, 2], [1, 2]])


def test_node_values_mean_of_leaves_and_mean_of_children():
    # T2: root ─┬─ a(1) ─┬─ c(3) r=1 ; d(4) r=0 ; e(5) r=0
    #           └─ b(2)  r=1 (an early-stopped leaf)
    tree = GroupTree([0, 1, 2, 3], [[1, 3], [1, 4], [1, 5], [2]], [[1, 2], [1, 2], [1, 2], [1]])
    r = [1.0, 0.0, 0.0, 1.0]
    leaves = leaf_mean_values(tree, r)
    children = child_mean_values(tree, r)
    assert leaves[1] == pytest.approx(1 / 3) and leaves[0] == pytest.approx(2 / 4)  # root: 2 of 4 leaves
    assert children[1] == pytest.approx(1 / 3) and children[0] == pytest.approx((1 / 3 + 1) / 2)  # SPO: 2/3


def test_treepo_averages_the_ancestor_subgroups_advantages():
    # root mean 3/4. leaf 0: root 1 − 0.75 = 0.25, subtree a {1, 0} mean 0.5 → 0.5: (0.25 + 0.5)/2 = 0.375;
    # leaf 1: (−0.75 − 0.5)/2 = −0.625; leaves 2, 3: root 0.25, subtree b {1, 1} → 0: 0.125. Nodes c..f hold one
    # leaf: no subgroup.
    batch = tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS)
    adv = treepo(batch, whiten=False)
    assert adv[:, 0].tolist() == pytest.approx([0.375, -0.625, 0.125, 0.125])
    assert adv[3].tolist() == pytest.approx([0.125, 0.125, 0.125, 0.0])  # every valid token, 0 past the row
    assert batch.stats["treepo/subgroups_mean"] == 2.0 and batch.stats["treepo/adv_shift"] == pytest.approx(0.125)
    # weighted by subgroup size: leaf 0 (0.25·4 + 0.5·2)/6 = 1/3, leaf 1 (−0.75·4 − 0.5·2)/6 = −2/3, leaves 2, 3: 1/6
    sized = treepo(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), weighting="size", whiten=False)
    assert sized[:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 6, 1 / 6])
    # subtree b's rewards are all 1: dropped with drop_flat_subgroups, leaves 2, 3 keep the root's 0.25
    flat = treepo(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), drop_flat_subgroups=True, whiten=False)
    assert flat[:, 0].tolist() == pytest.approx([0.375, -0.625, 0.25, 0.25])
    # whitened over the 15 valid tokens: mean 0, unbiased variance 1 (up to the 1e-8 under the root)
    white = treepo(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS))
    valid = white[batch.completion_mask.bool()]
    assert float(valid.mean()) == pytest.approx(0.0, abs=1e-6) and float(valid.var()) == pytest.approx(1.0, abs=1e-4)


def test_treepo_one_leaf_group_uses_baseline_zero_and_groups_are_apart():
    batch = tree_batch([0.5, 1.0, 0.0], [[1], [1, 2], [1, 3]], [[2], [1, 2], [1, 2]], groups=[0, 1, 1])
    adv = treepo(batch, whiten=False)
    # group 0: one leaf, baseline 0 → 0.5; group 1: root mean 0.5, node 1 holds both leaves (mean 0.5): ±0.5
    assert adv[:, 0].tolist() == pytest.approx([0.5, 0.5, -0.5])


def test_treerl_global_plus_local_over_sqrt_leaves():
    # V: root 0.75, a 0.5, b 1, leaves their rewards. a (2 leaves): GA = LA = −0.25 → −0.5/√2; c: GA 0.25, LA 0.5 →
    # 0.75; d: GA −0.75, LA −0.5 → −1.25; b: GA = LA = 0.25 → 0.5/√2; e, f: GA 0.25, LA 0 → 0.25.
    batch = tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS)
    adv = treerl(batch)
    s = 0.5 / math.sqrt(2)
    assert adv[0].tolist() == pytest.approx([-s, -s, 0.75, 0.75])
    assert adv[1].tolist() == pytest.approx([-s, -s, -1.25, -1.25])
    assert adv[2].tolist() == pytest.approx([s, s, 0.25, 0.25])
    assert adv[3].tolist() == pytest.approx([s, s, 0.25, 0.0])
    # |LA| over the 8 (row, step) pairs: .25 .5 .25 .5 .25 0 .25 0 → 0.25; 6 of 8 non-zero; |GA|: 2.5 / 8
    assert batch.stats["treerl/local_abs_mean"] == pytest.approx(0.25)
    assert batch.stats["treerl/local_nonzero_frac"] == pytest.approx(0.75)
    assert batch.stats["treerl/global_abs_mean"] == pytest.approx(0.3125)
    assert batch.stats["treerl/steps_per_leaf"] == 2.0
    only_global = treerl(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), local_weight=0.0, normalise="none")
    assert only_global[1].tolist() == pytest.approx([-0.25, -0.25, -0.75, -0.75])


def test_spo_tree_segment_advantages_split_copies_and_drop_zero_segments():
    # children's means: a = 0.5, b = 1, root = 0.75. A(a) = −0.25, A(b) = 0.25, A(c) = 0.5, A(d) = −0.5,
    # A(e) = A(f) = 0 (dropped). a and b are in two rows each: each copy weighted 1/2.
    batch = tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS)
    adv = spo_tree(batch, whiten=False, prob_threshold=None)
    assert adv[0].tolist() == pytest.approx([-0.125, -0.125, 0.5, 0.5])
    assert adv[1].tolist() == pytest.approx([-0.125, -0.125, -0.5, -0.5])
    assert adv[2].tolist() == pytest.approx([0.125, 0.125, 0.0, 0.0])
    assert adv[3].tolist() == pytest.approx([0.125, 0.125, 0.0, 0.0])
    keep = batch.extras[TOKEN_LOSS_MASK]
    assert keep.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert batch.stats["spo/zero_adv_frac"] == pytest.approx(3 / 15)  # e: 2 tokens, f: 1, of 15 valid
    assert batch.stats["spo/segment_adv_abs_mean"] == pytest.approx(0.25)
    assert batch.stats["spo/segments_per_leaf"] == 2.0
    repeat = spo_tree(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), shared="repeat", whiten=False, prob_threshold=None)
    assert repeat[0].tolist() == pytest.approx([-0.25, -0.25, 0.5, 0.5])
    # over the siblings' std (population): root's children 0.5, 1 (std 0.25) → A(a) = −1; a's 1, 0 (0.5) → A(c) = 1;
    # b's children 1, 1 (std 0): A = 0, dropped
    sib = spo_tree(
        tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), scale="siblings", shared="repeat", whiten=False, prob_threshold=None
    )
    assert sib[0].tolist() == pytest.approx([-1.0, -1.0, 1.0, 1.0], rel=1e-6)
    assert sib[2].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0], rel=1e-6)


def test_spo_tree_probability_mask_and_weighted_whitening():
    # x = [1, 3] weighted ½ each and [2] weighted 1 count as 2 tokens: mean (0.5 + 1.5 + 2)/2 = 2,
    # var (½·1 + ½·1 + 0)/(2 − 1) = 1 → x − 2
    out = weighted_whiten(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([[0.5, 0.5, 1.0]]))
    assert out.tolist()[0] == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)
    batch = tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS)
    batch.sampling_logprobs.fill_(math.log(0.5))
    batch.sampling_logprobs[0, 2] = math.log(0.95)  # p ≥ 0.9: out of the loss and the statistics
    batch.extras[TOKEN_LOSS_MASK] = torch.ones_like(batch.completion_mask)
    batch.extras[TOKEN_LOSS_MASK][1, 0] = 0  # a stage's mask is kept
    adv = spo_tree(batch)
    keep = batch.extras[TOKEN_LOSS_MASK]
    assert keep[0].tolist() == [1, 1, 0, 1] and keep[1].tolist() == [0, 1, 1, 1]
    assert batch.stats["spo/prob_masked_frac"] == pytest.approx(1 / 15)
    assert adv[0, 2] == 0 and adv[1, 0] == 0
    # the kept tokens, each counted by its weight, are whitened: Σ w·(a / w) = 0 where a = adv, w its weight
    w = torch.tensor([[0.5, 0.5, 1, 1], [0.5, 0.5, 1, 1], [0.5, 0.5, 1, 1], [0.5, 0.5, 1, 1]]) * keep
    white = torch.where(w > 0, adv / w.clamp(min=1e-9), torch.zeros_like(adv))
    assert float((white * w).sum()) == pytest.approx(0.0, abs=1e-5)


def test_estimators_need_the_tree_rollout():
    batch = make_batch([1.0, 0.0], [0, 0])
    for estimator in (treepo, treerl, spo_tree):
        with pytest.raises(ValueError, match="rollout=tree"):
            estimator(batch)
    with pytest.raises(ValueError, match="algorithm.advantage.weighting"):
        treepo(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), weighting="median")
    with pytest.raises(ValueError, match="algorithm.advantage.prob_threshold"):
        spo_tree(tree_batch(T1_REWARDS, T1_PATHS, T1_ENDS), prob_threshold=1.5)


# two steps on the tiny model with each method's tree rollout (its own settings): 12 new tokens, G = 4 leaves a prompt
RUNS = {"treepo": ["rollout=tree"], "treerl": ["rollout=eptree"], "spo_tree": ["rollout=spo_tree"]}


@pytest.mark.long  # ~15 s each on a quiet CPU: two rollouts of trees decoded segment by segment, two updates
@pytest.mark.parametrize("method", sorted(RUNS))
def test_tree_methods_train_two_steps(method, tiny_cfg):
    result = run(tiny_cfg(*VARYING, "trainer.autocast=off", f"algorithm={method}", *RUNS[method]))
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert m["advantage/abs_mean"] > 0 and m["tree/shared_token_frac"] > 0 and m["tree/leaves"] >= 2
    if method == "treepo":  # the ancestor subtrees moved the advantages off the root-only baseline
        assert m["treepo/adv_shift"] > 0 and m["treepo/subgroups_mean"] > 1
    if method == "treerl":  # forks were made and the steps' local advantages are not all 0
        assert m["tree/forks"] > 0 and m["treerl/local_abs_mean"] > 0 and m["treerl/steps_per_leaf"] > 1
    if method == "spo_tree":  # segments got their own advantages; the mask was applied (the tiny model: p < 0.9)
        assert m["spo/segment_adv_abs_mean"] > 0 and m["spo/segments_per_leaf"] > 1 and "spo/prob_masked_frac" in m


@pytest.mark.parametrize(("method", "rollout"), [("treepo", "tree"), ("treerl", "eptree"), ("spo_tree", "spo_tree")])
def test_tree_methods_refuse_a_rollout_without_trees_at_config_time(tiny_cfg, method, rollout):
    from rlexp.config.schema import ConfigError, validate

    with pytest.raises(ConfigError, match=rf"algorithm.advantage \({method}\) reads .* run it with rollout={rollout}"):
        validate(tiny_cfg(f"algorithm={method}"))
    validate(tiny_cfg(f"algorithm={method}", f"rollout={rollout}"))
