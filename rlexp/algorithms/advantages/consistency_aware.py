"""COPO — "COPO: Consistency-Aware Policy Optimization" (2025; arXiv 2508.04138), its advantage side.

GRPO's group-relative (local) advantage is 0 for every completion of a group whose outcomes are all equal, so such a
group gives no gradient. COPO adds a *global* signal per group and blends the two losses per completion:

* global reward of group g: R_g = mean_i r_i (the group's accuracy), optionally times the consistency coefficient
  1 − λ·H_g with λ = (1 − 1/n) / log2 n (the release's ``reward_coef_flg``, off in its run scripts);
* global advantage: R_g normalised over the batch's groups, A^glob_g = (R_g − mean_G R) / (std_G R + ε) — a group
  that is always right gets a positive, one that is always wrong a negative advantage, where GRPO gives 0;
* blend weight of the local loss: w_i = σ(γ·(H_g − ρ)) · 1[r_i ≠ 0], H_g the entropy (bits) of the group's
  distribution of extracted answers; low entropy (a consistent group) leans on the global loss, high entropy on the
  local one. The indicator is the release's ``global_flg=soft-with-zero`` (its COPO setting): a completion scored 0
  trains on the global loss only (``gate=none``: the release's ``only-soft``, no indicator);
* loss per token: w_i·ℓ_clip(A^loc_i) + (1 − w_i)·ℓ_clip(A^glob_g), both PPO-clipped with the same ratio — the loss
  part :func:`rlexp.algorithms.losses.consistency_blend.copo_clip`.

The blend of the two clipped losses is not the clipped loss of the blended advantage when the two advantages differ in
sign (the clip regions differ), so the estimator returns the local (GRPO) advantage and hands the global advantage
and the weight to the loss through ``batch.extras``.

Released code (hijih/copo-code): ``verl/trainer/ppo/core_algos.py`` — ``compute_score_global`` (R_g, H_g, λ),
``compute_grpo_outcome_advantage_with_global`` (A^loc, A^glob), ``compute_policy_loss_with_global`` (w, the blend);
hyper-parameters ``verl/run_copo.sh`` (γ = k = 5, ρ = b = 1, n = 6).
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.advantages.group import SCALES, check_singleton, normalize_rewards
from rlexp.algorithms.losses.consistency_blend import GLOBAL_ADV, LOCAL_WEIGHT
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import ANSWER_CLUSTER
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import batch_mean, batch_std

ENTROPY_OF = ("answer", "outcome")
GATES = ("correct", "none")


def entropy_bits(labels: list) -> float:
    """Entropy in bits of the empirical distribution of ``labels`` (0 for one distinct label)."""
    counts: dict = {}
    for x in labels:
        counts[x] = counts.get(x, 0) + 1
    n = len(labels)
    return -sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


def consistency_coef(entropy: float, n: int) -> float:
    """The release's consistency coefficient 1 − λ·H, λ = (1 − 1/n) / log2 n (1 for a group of one)."""
    return 1.0 - (1.0 - 1.0 / n) / math.log2(n) * entropy if n > 1 else 1.0


def blend_weight(entropy: torch.Tensor, gamma: float, rho: float) -> torch.Tensor:
    """Weight of the local loss, σ(γ·(H − ρ)); 1 − it weighs the global loss."""
    return torch.sigmoid(gamma * (entropy - rho))


def check_copo(gamma: float, rho: float, entropy_of: str, gate: str, scale: str, eps: float) -> None:
    if not (isinstance(gamma, int | float) and gamma >= 0):
        raise ValueError(f"algorithm.advantage.gamma={gamma!r} (the soft-blend slope) must be >= 0")
    if not isinstance(rho, int | float):
        raise ValueError(f"algorithm.advantage.rho={rho!r} (the entropy of an even blend) must be a number")
    if entropy_of not in ENTROPY_OF:
        raise ValueError(f"algorithm.advantage.entropy_of={entropy_of!r} is not one of {list(ENTROPY_OF)}")
    if gate not in GATES:
        raise ValueError(f"algorithm.advantage.gate={gate!r} is not one of {list(GATES)}")
    if scale not in SCALES:
        raise ValueError(f"algorithm.advantage.scale={scale!r} is not one of {list(SCALES)}")
    if eps < 0:
        raise ValueError(f"algorithm.advantage.eps={eps} must be >= 0")


@ADVANTAGES.register
def copo(
    batch: RolloutBatch,
    gamma: float = 5.0,
    rho: float = 1.0,
    entropy_of: str = "answer",
    gate: str = "correct",
    consistency_reward: bool = False,
    scale: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> torch.Tensor:
    """COPO (see the module docstring): returns GRPO's local advantage and writes the global advantage
    (``batch.extras["copo_global_adv"]``) and the local loss's weight (``batch.extras["copo_local_weight"]``) for the
    ``copo_clip`` loss. ``entropy_of``: ``answer`` — entropy of the group's answer clusters from the ``AnswerVotes``
    stage (the release; rows without an answer share one category, as the release's empty answer string), ``outcome``
    — of its reward values. ``scale``: ``group`` divides both advantages by their std (the release's
    ``norm_adv_by_std_in_grpo``), ``none`` only centres (``batch`` is GRPO's batch std for the local part; the global
    part then uses its std over groups too). Stats: ``copo/global_weight_mean`` (mean 1 − w, the global loss's share),
    ``copo/uniform_group_frac``, ``copo/global_adv_abs_mean``, ``copo/uniform_global_adv_abs_mean`` (the global
    advantage of the groups GRPO gives 0), ``copo/entropy_mean``."""
    check_copo(gamma, rho, entropy_of, gate, scale, eps)
    check_singleton(singleton)
    device = batch.reward.device
    reward = batch.reward.float()
    local = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    if entropy_of == "answer":
        if ANSWER_CLUSTER not in batch.extras:
            raise KeyError(
                "algorithm.advantage.entropy_of=answer needs the AnswerVotes group stage "
                "(rlexp.algorithms.group_stages.votes.AnswerVotes) in algorithm.group_stages"
            )
        labels = batch.extras[ANSWER_CLUSTER].tolist()
    else:
        labels = reward.tolist()
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    n_rows = len(batch)
    entropy = torch.zeros(n_rows, device=device)
    group_reward, group_rows, uniform = [], [], []
    for rows in groups.values():
        h = entropy_bits([labels[i] for i in rows])
        r = reward[rows]
        mean = float(r.mean())
        if consistency_reward:
            mean *= consistency_coef(h, len(rows))
        entropy[rows] = h
        group_reward.append(mean)
        group_rows.append(rows)
        uniform.append(len(rows) > 1 and bool((r == r[0]).all()))
    g_reward = torch.tensor(group_reward, device=device)
    g_adv = g_reward - batch_mean(g_reward)  # over every process's groups in a distributed step
    if scale != "none":  # the std over the batch's groups (unbiased, as torch.std in the release); one group: 0
        std = batch_std(g_reward)
        g_adv = g_adv / (std + eps) if float(std) > 0 or eps > 0 else torch.zeros_like(g_adv)
    global_adv = torch.zeros(n_rows, device=device)
    for rows, a in zip(group_rows, g_adv):
        global_adv[rows] = a
    weight = blend_weight(entropy, gamma, rho)
    if gate == "correct":
        weight = weight * (reward != 0).float()
    batch.extras[GLOBAL_ADV] = global_adv
    batch.extras[LOCAL_WEIGHT] = weight
    if n_rows:
        uni = torch.tensor(uniform)
        batch.stats["copo/global_weight_mean"] = float((1.0 - weight).mean())
        batch.stats["copo/uniform_group_frac"] = float(uni.float().mean())
        batch.stats["copo/global_adv_abs_mean"] = float(global_adv.abs().mean())
        batch.stats["copo/uniform_global_adv_abs_mean"] = (
            float(g_adv[uni.to(device)].abs().mean()) if bool(uni.any()) else 0.0
        )
        batch.stats["copo/entropy_mean"] = float(entropy.mean())
    return local
