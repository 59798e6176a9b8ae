"""Advantages of tree rollouts (issue 23): each row is a leaf of its prompt's tree (``rlexp.rollout.tree``), and its
completion is the chain of nodes on its path; ``record["episode"]["tree"]`` names those nodes and where each ends.
A node's leaves L(n) are the rows whose path passes through it; the root is the prompt (all the group's rows).

* ``treepo`` — TreePO's tree-based advantage (Li et al., 2025, arXiv 2508.17445; released code
  multimodal-art-projection/TreePO ``core_algos.py``: ``compute_tree_reinforce_plus_plus_baseline_outcome_advantage``,
  the estimator of ``run_treepo_train.sh``): leaf i's advantage aggregates its reward's advantage over the subgroups of
  its ancestors — the root's (all the prompt's leaves; mean 0 when it holds one row) and every ancestor node's whose
  subgroup holds more than one leaf: a_i = agg_S (r_i − mean_{j∈S} r_j), ``weighting`` average (the script's) or
  size (weights |S|); ``drop_flat_subgroups`` leaves out the ancestors' subgroups whose rewards are all equal (the
  code's ``subtree_std_ds``). One value per row, then whitened over the batch's valid tokens (REINFORCE++-baseline's
  ``masked_whiten``; ``whiten=false``: not); a shared prefix is trained in every row that holds it, each copy with
  its row's advantage (the code's: one row per leaf, no reweighting). Metrics ``treepo/subgroups_mean`` (subgroups
  per leaf, the root's included), ``treepo/adv_shift`` (mean |a_i − (r_i − mean_root)| before whitening: what the
  subtrees changed).
* ``treerl`` — TreeRL's process supervision from the tree (Hou et al., 2025, arXiv 2506.11902, §3.2): a node's value
  V(n) = the mean reward of its leaves; a step (node) n on a leaf's path gets R(n) = [GA(n) + LA(n)] / √|L(n)|, GA =
  V(n) − V(root), LA = V(n) − V(parent(n)) (``global_weight``, ``local_weight`` scale the two; ``normalise=none``
  drops the √|L(n)|, which the paper applies because a step with |L(n)| leaves is trained once per row that holds
  it). Every token of the step gets R(n). Metrics ``treerl/global_abs_mean``, ``treerl/local_abs_mean`` (over the
  rows' steps), ``treerl/local_nonzero_frac`` (steps whose value differs from their parent's: process signal beyond
  the outcome), ``treerl/steps_per_leaf``.
* ``spo_tree`` — SPO-tree's segment advantages ("Segment Policy Optimization", Guo et al., 2025, arXiv 2505.23564;
  released code AIFrameResearch/SPO: ``hybrid_inference_strategy.py`` values, ``tree_episode_generator.py``
  ``extract_edges_from_tree``, ``ppo_trainer.py``): V(leaf) = its reward, V(n) = the mean of its children's values
  (``value=children``, the code's; ``leaves``: the mean of its leaves'), a segment's advantage A(n) = V(n) −
  V(parent(n)) (``scale=none``, the code's ``rloo``; ``siblings``: divided by the std of the parent's children's
  values + 1e-8, its ``grpo``). SPO trains each segment (an edge of the tree) once, as its own sample; here a segment
  is in every row below it, so ``shared=split`` weighs each copy by 1/|L(n)| (the segment counts once; ``repeat``:
  each copy in full). Segments with A = 0 are dropped (``drop_zero``: out of the loss and the statistics, as the code
  keeps only edges with a non-zero advantage); the advantages are whitened over the kept tokens, each weighted as it
  counts (``whiten``: the trainer's ``whiten_advantages``, Bessel on the token count); the probability mask
  (``prob_threshold``: tokens whose old-policy probability is at least 0.9 leave the loss and the whitening — SPO's
  ``use_prob_mask``; null: off) is set as ``batch.extras["token_loss_mask"]`` (the old log-probs when the trainer
  recomputed them, else the sampling ones). Metrics ``spo/segment_adv_abs_mean`` (|A| over the rows' segments before
  whitening), ``spo/zero_adv_frac`` and ``spo/prob_masked_frac`` (of the valid tokens), ``spo/segments_per_leaf``.

Every estimator returns (N, T) per-token advantages (0 past a row's tokens)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_LOSS_MASK
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten

ROOT = 0  # node id of the prompt (rlexp.rollout.tree numbers the nodes from 1)
WEIGHTINGS = ("average", "size")
NORMALISES = ("sqrt", "none")
VALUES = ("children", "leaves")
SPO_SCALES = ("none", "siblings")
SHARED = ("split", "repeat")


@dataclass
class GroupTree:
    """One group's tree, rebuilt from its rows' paths: ``rows`` (batch indices, one per leaf), each leaf's ``paths``
    (node ids, root excluded) and ``ends`` (completion offset where each ends), each node's ``parent``, ``children``
    (in order of appearance) and ``leaves`` (positions in ``rows``)."""

    rows: list[int]
    paths: list[list[int]]
    ends: list[list[int]]
    parent: dict[int, int] = field(default_factory=dict)
    children: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    leaves: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self):
        for i, path in enumerate(self.paths):
            self.leaves[ROOT].append(i)
            prev = ROOT
            for n in path:
                if n not in self.parent:
                    self.parent[n] = prev
                    self.children[prev].append(n)
                elif self.parent[n] != prev:
                    raise ValueError(f"tree rows disagree on node {n}'s parent ({self.parent[n]} and {prev})")
                self.leaves[n].append(i)
                prev = n


def group_trees(batch: RolloutBatch, who: str) -> list[GroupTree]:
    """The batch's groups as trees (``who``: the estimator, for the error naming what it needs)."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    out = []
    for rows in groups.values():
        trees = [((batch.records[i] or {}).get("episode") or {}).get("tree") for i in rows]
        if any(t is None for t in trees):
            raise ValueError(
                f"algorithm.advantage ({who}) reads the tree rollout's leaves (record['episode']['tree']): run it with "
                "rollout=tree (TreePO's segment tree), rollout=eptree (TreeRL's EPTree) or rollout=spo_tree"
            )
        out.append(GroupTree(rows, [list(t["nodes"]) for t in trees], [list(t["ends"]) for t in trees]))
    return out


def token_nodes(ends: list[int], width: int) -> torch.Tensor:
    """(width,) the index on the path of the node that holds each completion position (the last node past its end)."""
    if not ends:
        return torch.zeros(width, dtype=torch.long)
    idx = torch.searchsorted(torch.tensor(ends, dtype=torch.long), torch.arange(width), right=True)
    return idx.clamp(max=len(ends) - 1)


def per_token(tree: GroupTree, values: list[list[float]], width: int) -> torch.Tensor:
    """(rows, width): each row's per-node ``values`` (one per node of its path) spread over the nodes' tokens."""
    out = torch.zeros(len(tree.rows), width)
    for k, (vals, ends) in enumerate(zip(values, tree.ends)):
        if vals:
            out[k] = torch.tensor(vals, dtype=torch.float32)[token_nodes(ends, width)]
    return out


def leaf_mean_values(tree: GroupTree, rewards: list[float]) -> dict[int, float]:
    """V(n): the mean reward of each node's leaves (the root's: the group's mean)."""
    return {n: sum(rewards[i] for i in leaves) / len(leaves) for n, leaves in tree.leaves.items()}


def child_mean_values(tree: GroupTree, rewards: list[float]) -> dict[int, float]:
    """V(n): a leaf's reward at its last node; above, the mean of the children's values (SPO's recursion)."""
    own = {path[-1]: rewards[i] for i, path in enumerate(tree.paths) if path}
    values: dict[int, float] = {}

    def value(n: int) -> float:
        if n not in values:
            kids = tree.children.get(n, [])
            values[n] = sum(value(c) for c in kids) / len(kids) if kids else own.get(n, 0.0)
        return values[n]

    for n in [ROOT, *tree.parent]:
        value(n)
    return values


@ADVANTAGES.register
def treepo(
    batch: RolloutBatch,
    weighting: str = "average",
    drop_flat_subgroups: bool = False,
    whiten: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """TreePO's subgroup-aggregated advantage (module doc), (N, T)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"algorithm.advantage.weighting={weighting!r} is not one of {list(WEIGHTINGS)}")
    mask = batch.completion_mask
    rewards = batch.reward.float().tolist()
    adv = torch.zeros(len(batch))
    terms_per_leaf, shift = [], []
    for tree in group_trees(batch, "treepo"):
        r = [rewards[i] for i in tree.rows]
        root = sum(r) / len(r) if len(r) > 1 else 0.0  # a one-row group: baseline 0 (REINFORCE++-baseline's)
        for k, path in enumerate(tree.paths):
            terms = [(r[k] - root, len(r))]
            for n in path:
                group = [r[j] for j in tree.leaves[n]]
                if len(group) < 2 or (drop_flat_subgroups and max(group) == min(group)):
                    continue
                terms.append((r[k] - sum(group) / len(group), len(group)))
            if weighting == "average":
                a = sum(t for t, _ in terms) / len(terms)
            else:
                a = sum(t * s for t, s in terms) / sum(s for _, s in terms)
            adv[tree.rows[k]] = a
            terms_per_leaf.append(len(terms))
            shift.append(abs(a - terms[0][0]))
    batch.stats["treepo/subgroups_mean"] = _mean(terms_per_leaf)
    batch.stats["treepo/adv_shift"] = _mean(shift)
    tokens = adv.to(mask.device)[:, None] * mask.float()
    return masked_whiten(tokens, mask, eps) * mask if whiten else tokens


@ADVANTAGES.register
def treerl(
    batch: RolloutBatch, global_weight: float = 1.0, local_weight: float = 1.0, normalise: str = "sqrt"
) -> torch.Tensor:
    """TreeRL's per-step reward GA + LA over √|L(n)| (module doc), (N, T)."""
    if normalise not in NORMALISES:
        raise ValueError(f"algorithm.advantage.normalise={normalise!r} is not one of {list(NORMALISES)}")
    mask = batch.completion_mask
    width = mask.shape[1]
    rewards = batch.reward.float().tolist()
    adv = torch.zeros(mask.shape)
    ga_abs, la_abs, la_nonzero, steps = [], [], [], []
    for tree in group_trees(batch, "treerl"):
        V = leaf_mean_values(tree, rewards_of(tree, rewards))
        values = []
        for path in tree.paths:
            row = []
            for n in path:
                ga, la = V[n] - V[ROOT], V[n] - V[tree.parent[n]]
                scale = math.sqrt(len(tree.leaves[n])) if normalise == "sqrt" else 1.0
                row.append((global_weight * ga + local_weight * la) / scale)
                ga_abs.append(abs(ga))
                la_abs.append(abs(la))
                la_nonzero.append(float(abs(la) > 1e-12))
            values.append(row)
            steps.append(len(path))
        adv[tree.rows] = per_token(tree, values, width)
    batch.stats["treerl/global_abs_mean"] = _mean(ga_abs)
    batch.stats["treerl/local_abs_mean"] = _mean(la_abs)
    batch.stats["treerl/local_nonzero_frac"] = _mean(la_nonzero)
    batch.stats["treerl/steps_per_leaf"] = _mean(steps)
    return adv.to(mask.device) * mask


@ADVANTAGES.register
def spo_tree(
    batch: RolloutBatch,
    value: str = "children",
    scale: str = "none",
    shared: str = "split",
    drop_zero: bool = True,
    whiten: bool = True,
    prob_threshold: float | None = 0.9,
    eps: float = 1e-8,
) -> torch.Tensor:
    """SPO-tree's segment advantages V(n) − V(parent) with its probability mask (module doc), (N, T)."""
    for key, v, allowed in (("value", value, VALUES), ("scale", scale, SPO_SCALES), ("shared", shared, SHARED)):
        if v not in allowed:
            raise ValueError(f"algorithm.advantage.{key}={v!r} is not one of {list(allowed)}")
    if prob_threshold is not None and not 0.0 < prob_threshold <= 1.0:
        raise ValueError(f"algorithm.advantage.prob_threshold={prob_threshold} must be in (0, 1] (or null: off)")
    mask = batch.completion_mask
    width = mask.shape[1]
    rewards = batch.reward.float().tolist()
    raw = torch.zeros(mask.shape)
    weight = torch.ones(mask.shape)
    seg_abs, segs = [], []
    for tree in group_trees(batch, "spo_tree"):
        r = rewards_of(tree, rewards)
        V = child_mean_values(tree, r) if value == "children" else leaf_mean_values(tree, r)
        adv, share = [], []
        for path in tree.paths:
            row = []
            for n in path:
                a = V[n] - V[tree.parent[n]]
                if scale == "siblings":
                    sib = [V[c] for c in tree.children[tree.parent[n]]]
                    m = sum(sib) / len(sib)
                    a /= math.sqrt(sum((x - m) ** 2 for x in sib) / len(sib)) + 1e-8
                row.append(a)
                seg_abs.append(abs(a))
            adv.append(row)
            share.append([1.0 / len(tree.leaves[n]) if shared == "split" else 1.0 for n in path])
            segs.append(len(path))
        raw[tree.rows] = per_token(tree, adv, width)
        weight[tree.rows] = per_token(tree, share, width)
    raw, weight = raw.to(mask.device), weight.to(mask.device)
    valid = mask.bool()
    keep = valid & (raw != 0) if drop_zero else valid.clone()
    zero = float(((raw == 0) & valid).sum()) / max(1, int(valid.sum()))
    probable = torch.zeros_like(valid)
    if prob_threshold is not None:
        old = batch.old_logprobs if batch.old_logprobs is not None else batch.sampling_logprobs
        probable = valid & (old.to(mask.device).float().exp() >= prob_threshold)
        keep = keep & ~probable
    prev = batch.extras.get(TOKEN_LOSS_MASK)
    token_mask = keep if prev is None else keep & prev.to(mask.device).bool()
    batch.extras[TOKEN_LOSS_MASK] = token_mask.to(mask.dtype)
    batch.stats["spo/segment_adv_abs_mean"] = _mean(seg_abs)
    batch.stats["spo/zero_adv_frac"] = zero
    batch.stats["spo/prob_masked_frac"] = float(probable.sum()) / max(1, int(valid.sum()))
    batch.stats["spo/segments_per_leaf"] = _mean(segs)
    out = raw
    if whiten:
        out = weighted_whiten(raw, weight * token_mask.float(), eps)
    return out * weight * token_mask.float()


def weighted_whiten(values: torch.Tensor, weights: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean)·rsqrt(var + eps) with each position counted ``weights`` times (a token in k rows weighted 1/k
    counts once): mean = Σwx/Σw, var = Σw(x − mean)²/(Σw − 1) (Bessel on the count; 0 below two)."""
    w = weights.float()
    count = w.sum()
    mean = (values * w).sum() / count.clamp(min=1e-12)
    var = (((values - mean) ** 2) * w).sum() / (count - 1).clamp(min=1e-12)
    if count < 2:
        var = torch.zeros_like(var)
    return (values - mean) * torch.rsqrt(var + eps)


def rewards_of(tree: GroupTree, rewards: list[float]) -> list[float]:
    """The group's rewards, by leaf position."""
    return [rewards[i] for i in tree.rows]


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0
