"""TP-GRPO's advantage with the capability-adaptive thought rewards (Stage II of "Good Learners Think Their Thinking:
Generative PRM Makes Large Reasoning Model More Efficient Math Learner", He et al., 2025, arXiv 2507.23317; ICLR 2026
as "Smarter Not Harder: ... Ability-Adaptive Reward Shaping"; code github.com/cs-holder/tp_grpo, not stored here:
the formula below is the paper's as summarised in a public note of the ICLR version, the paper's text was not
readable here).

Process-supervised GRPO: the outcome reward is standardised within the group as GRPO's, r̂ᵢ = (rᵢ − mean_g)/(std_g + ε)
(``scale``, ``eps``, ``singleton`` as ``grpo``); the process rewards are NOT standardised; a token's advantage is the
sum of the rewards from it to the end, Âᵢ,ₜ = r̂ᵢ + Σ_{thoughts k of row i ending at or after t} pᵢ,ₖ. Each thought but
the last (``ThoughtUnits``: ``batch.extras["thought_labels"]``, +1 right / −1 wrong at its last token) is paid

* in a correct solution: +r_c for a right thought, −r_c for a wrong one, with the capability-adaptive scale
  r_c = α · acc_G, acc_G the share of correct solutions in the row's group (a hard prompt, acc_G → 0, falls back to
  the outcome reward and leaves room to explore; an easy one gets the strongest process signal);
* in a wrong solution (r̂ᵢ ≤ 0): r̂ᵢ for a thought matching the wrong answer (judged wrong), −r̂ᵢ for the others.

Consecutive thoughts alternate labels and the last one carries the outcome's label, so the sums telescope to the
paper's two propositions: in a correct solution the tokens of right thoughts keep Â = r̂ᵢ and those of wrong thoughts
get r̂ᵢ − r_c; in a wrong solution the matching thoughts keep r̂ᵢ and the others get 0 — the process reward only
removes credit from invalid steps, it never moves the target of the key tokens (the paper's guard against reward
hacking). Metrics: ``tp_grpo/process_abs_mean`` (mean |Â − r̂| over the valid tokens: how much the thoughts moved the
advantage) and ``tp_grpo/r_c_mean`` (α · acc_G over the correct rows)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.algorithms.group_stages.thought_rewards import THOUGHT_CORRECT, THOUGHT_LABELS
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import group_stats


def thought_rewards(
    labels: torch.Tensor, correct: torch.Tensor, outcome: torch.Tensor, acc_group: torch.Tensor, alpha: float
) -> torch.Tensor:
    """(N, T) process rewards at the thoughts' last tokens: α·acc_G·label on correct rows, −label·r̂ on wrong ones."""
    correct = correct.bool()[:, None]
    return torch.where(correct, labels * (alpha * acc_group)[:, None], -labels * outcome[:, None])


@ADVANTAGES.register
def tp_grpo(
    batch: RolloutBatch, alpha: float = 1.0, scale: str = "group", eps: float = 1e-6, singleton: str = "zero"
) -> torch.Tensor:
    """TP-GRPO's token advantages (module docstring): the group-standardised outcome plus the capability-adaptive
    thought rewards summed from each token to the end. Needs the ``ThoughtUnits`` group stage. Returns (N, T)."""
    if alpha < 0:
        raise ValueError(f"algorithm.advantage.alpha={alpha}: the process reward scale α must be >= 0")
    if THOUGHT_LABELS not in batch.extras or THOUGHT_CORRECT not in batch.extras:
        raise ValueError(
            "algorithm.advantage (tp_grpo) reads the thought units of the ThoughtUnits group stage "
            "(rlexp.algorithms.group_stages.thought_rewards.ThoughtUnits in algorithm.group_stages): none ran"
        )
    mask = batch.completion_mask.float()
    outcome = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    correct = batch.extras[THOUGHT_CORRECT].float().to(outcome.device)
    acc_group, _, _ = group_stats(correct, batch.group_ids.to(outcome.device))
    labels = batch.extras[THOUGHT_LABELS].float().to(outcome.device)
    if tuple(labels.shape) != tuple(mask.shape):
        raise ValueError(
            f"batch.extras['thought_labels'] has shape {tuple(labels.shape)}; expected {tuple(mask.shape)}"
        )
    rewards = thought_rewards(labels, correct, outcome, acc_group, float(alpha)) * mask.to(outcome.device)
    to_end = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
    adv = (outcome[:, None] + to_end) * mask.to(outcome.device)
    valid = mask.sum()
    batch.stats["tp_grpo/process_abs_mean"] = float((to_end.abs() * mask).sum() / valid) if valid > 0 else 0.0
    right = correct > 0
    batch.stats["tp_grpo/r_c_mean"] = float((alpha * acc_group[right]).mean()) if bool(right.any()) else 0.0
    return adv
