"""Direct Advantage Policy Optimization's quadratic loss ("Improving Multi-Step Reasoning Abilities of Large Language
Models with Direct Advantage Policy Optimization", Liu et al., 2024, arXiv 2412.18279; not ByteDance's DAPO,
``algorithm/dapo``): the log-ratio of each reasoning step to the reference policy is regressed onto the step's
advantage scaled by 1/β — the KL-regularised optimum π* ∝ π_ref·exp(A/β) has log π*/π_ref = A/β (up to the state's
normaliser, which the centred step advantages leave out).

Per step j of a completion (the tokens [b_j, b_{j+1}) between the boundaries ``batch.extras["mc_boundaries"]`` that
``rlexp.algorithms.group_stages.monte_carlo.MonteCarloValues`` writes), with S_j = Σ_{t ∈ j} log π_θ(y_t)/π_ref(y_t)
and A_j the step's advantage (``rlexp.algorithms.advantages.segment_values``: the same value on each of its tokens):

    e_j = S_j − A_j / β,        ℓ = Σ_j e_j²

spread over the step's tokens in the loss mask (each gets e_j² / n_j, so the aggregation's token sum of a step is its
e_j²). π_ref is the policy that sampled the rollout (``old_logp``; iterative DAPO's reference: each round's policy);
on the first optimiser step S_j = 0 and the gradient −2·A_j/β·∇S_j is the step-level policy gradient; later steps
stop once a step's log-ratio reaches A_j/β. Tokens before the first boundary (none with ``boundaries=steps``) and
outside the mask get 0. ``level=token``: e_t = log r_t − A_t/β per token (the same gradient direction as verl's
``dro`` loss, ``losses.reinforce.dro``).

Stats: ``direct_advantage/residual_sq`` (e_j² per token of its step), ``direct_advantage/step_log_ratio`` (S_j per
token of its step), ``direct_advantage/target`` (A_j/β), and the ratio statistics."""

from __future__ import annotations

import torch

from rlexp.algorithms.group_stages.monte_carlo import MC_BOUNDARIES
from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats, uses_batch_extras
from rlexp.core.registry import LOSSES

LEVELS = ("step", "token")


def step_ids(boundaries: torch.Tensor, width: int) -> torch.Tensor:
    """(N, width) long: the step index of each token — the number of a row's boundaries (−1: none) at or before it,
    minus 1; −1 before the first boundary."""
    b = boundaries.long()
    t = torch.arange(width, device=b.device)
    valid = (b >= 0)[:, None, :]
    return ((b[:, None, :] <= t[None, :, None]) & valid).sum(-1) - 1


@LOSSES.register
@uses_batch_extras(MC_BOUNDARIES)
def direct_advantage(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    mc_boundaries: torch.Tensor | None = None,
    beta: float = 1.0,
    level: str = "step",
) -> LossOutput:
    """DAPO's quadratic step loss (module doc). ``beta`` > 0; ``level``: step | token."""
    if beta <= 0:
        raise ValueError(f"algorithm.loss (direct_advantage) beta={beta} must be > 0")
    if level not in LEVELS:
        raise ValueError(f"algorithm.loss (direct_advantage) level={level!r} is not one of {list(LEVELS)}")
    adv = expand_like(advantages, logp).detach().float()
    m = mask.float()
    log_ratio = (logp.float() - old_logp.float()) * m
    ratio = torch.exp(log_ratio.detach())
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    if level == "token":
        e = log_ratio - adv / beta
        per_token = e.square() * m
        stats = ratio_stats(ratio, zero, zero)
        stats.update(
            {
                "direct_advantage/residual_sq": e.detach().square(),
                "direct_advantage/step_log_ratio": log_ratio.detach(),
                "direct_advantage/target": adv / beta,
            }
        )
        return LossOutput(per_token, stats)
    if mc_boundaries is None:
        raise ValueError(
            "algorithm.loss (direct_advantage, level=step) reads batch.extras['mc_boundaries']: put "
            "rlexp.algorithms.group_stages.monte_carlo.MonteCarloValues last in algorithm.group_stages"
        )
    n, width = logp.shape
    ids = step_ids(mc_boundaries.to(logp.device), width)
    inside = (ids >= 0).float() * m
    slots = int(mc_boundaries.shape[1]) if mc_boundaries.dim() == 2 else 0
    idx = ids.clamp(min=0)
    step_sum = torch.zeros(n, max(slots, 1), device=logp.device, dtype=log_ratio.dtype)
    step_sum = step_sum.scatter_add(1, idx, log_ratio * inside)
    count = torch.zeros_like(step_sum).scatter_add(1, idx, inside)
    adv_sum = torch.zeros_like(step_sum).scatter_add(1, idx, adv * inside)
    step_adv = adv_sum / count.clamp(min=1)
    e = step_sum - step_adv / beta  # (n, steps)
    per_step = e.square() / count.clamp(min=1)
    per_token = per_step.gather(1, idx) * inside
    stats = ratio_stats(ratio, zero, zero)
    stats.update(
        {
            "direct_advantage/residual_sq": e.detach().square().gather(1, idx) * inside,
            "direct_advantage/step_log_ratio": step_sum.detach().gather(1, idx) * inside,
            "direct_advantage/target": (step_adv / beta).gather(1, idx) * inside,
        }
    )
    return LossOutput(per_token, stats)
