"""Label-free advantages from a group's own answer distribution.

``restrain`` — RESTRAIN ("RESTRAIN: From Spurious Votes to Signals — Self-Driven RL with Self-Penalization", Yu et
al., 2025; arXiv 2510.02172), two of its three self-penalisation parts on top of GRPO:

* **pseudo-label weighting** — every distinct answer of the group is a pseudo-label, not only the majority: with
  label j each completion scores 1[a_i = j] and gets its group-normalised advantage A_i^j; the advantage is
  Σ_j w_j A_i^j, with w_j ∝ g(f_j) over the group's answers, f_j the answer's share of the group and
  g(f) = exp(−(1 − f)² / (2σ²)) (frequent answers weigh most, minority answers keep some weight);
* **negative rollout penalisation** — a group whose largest answer cluster holds fewer than ``kappa`` of its G
  completions (low self-consistency) gets advantage −``delta`` on every completion instead.

The answer clusters come from the ``AnswerVotes`` group stage (``batch.extras["answer_cluster"]``); a completion
without an answer is never a pseudo-label (it scores 0 under every label).
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import ANSWER_CLUSTER
from rlexp.core.registry import ADVANTAGES


def pseudo_label_weights(shares: list[float], sigma: float) -> list[float]:
    """w_j ∝ exp(−(1 − f_j)² / (2σ²)), normalised to sum 1 over the group's answers."""
    raw = [math.exp(-((1.0 - f) ** 2) / (2 * sigma**2)) for f in shares]
    total = sum(raw)
    return [r / total for r in raw]


@ADVANTAGES.register
def restrain(
    batch: RolloutBatch, sigma: float = 0.5, kappa: int = 3, delta: float = 0.5, eps: float = 1e-6
) -> torch.Tensor:
    """RESTRAIN's advantage (see the module docstring). Stats: ``restrain/penalised_group_frac``,
    ``restrain/majority_weight_mean`` (the weight of each group's most frequent answer; 1 = TTRL's single label)."""
    if sigma <= 0 or kappa < 0 or delta < 0:
        raise ValueError(
            f"algorithm.advantage: restrain needs sigma > 0, kappa >= 0, delta >= 0 (got {sigma}, {kappa}, {delta})"
        )
    if ANSWER_CLUSTER not in batch.extras:
        raise KeyError(
            "algorithm.advantage=restrain needs the AnswerVotes group stage "
            "(rlexp.algorithms.group_stages.votes.AnswerVotes) in algorithm.group_stages"
        )
    cluster = batch.extras[ANSWER_CLUSTER].to(batch.reward.device)
    adv = torch.zeros(len(batch), device=batch.reward.device)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    penalised, top_weights = 0, []
    for rows in groups.values():
        idx = torch.tensor(rows, device=adv.device)
        c = cluster[idx]
        labels = sorted({int(j) for j in c.tolist() if j >= 0})
        counts = [int((c == j).sum()) for j in labels]
        if not labels or max(counts) < kappa:
            adv[idx] = -delta
            penalised += 1
            continue
        weights = pseudo_label_weights([n / len(rows) for n in counts], sigma)
        top_weights.append(weights[counts.index(max(counts))])
        same_group = torch.zeros(len(rows), dtype=torch.long, device=adv.device)
        for j, w in zip(labels, weights):
            adv[idx] += w * normalize_rewards((c == j).float(), same_group, eps=eps)
    batch.stats["restrain/penalised_group_frac"] = penalised / max(len(groups), 1)
    batch.stats["restrain/majority_weight_mean"] = sum(top_weights) / len(top_weights) if top_weights else math.nan
    return adv
