"""Covariance-selected token updates ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", 2025): Clip-Cov and KL-Cov.

Both rank tokens by the centred covariance (A − Ā)(log π − mean log π), the means over the valid tokens, and
act on a small share of them: Clip-Cov detaches ⌊clip_ratio · #tokens⌋ (≥ 1) tokens drawn at random among
those the PPO clip leaves unclipped whose covariance lies in (cov_lb, cov_ub); KL-Cov adds kl_coef · |log r|
on the ⌊kl_ratio · #tokens⌋ (≥ 1) tokens of largest covariance. As released (PRIME-RL/Entropy-Mechanism-of-RL,
``verl/trainer/ppo/core_algos.py``: ``compute_policy_loss_clip_cov``, ``compute_policy_loss_kl_cov``, called
per micro-batch by ``verl/workers/actor/dp_actor.py``), the means, the token count and the selection are
those of one micro-batch on one device, so they change with the micro-batch split (dynamic batch size
included) and the one-token floor applies per micro-batch.

``scope`` says over which tokens the selection runs:

* ``mini_batch`` (default, our choice): over the whole mini-batch of the optimiser step, independent of how
  it is cut into micro-batches. Before each optimiser step the trainer calls ``loss.select`` with the
  current policy's log-probs of the whole mini-batch (``rlexp.trainer.optimize.policy_update``: a no-grad
  forward, or the recomputed old log-probs on the first step, where they are the current ones) and hands
  each micro-batch its slice of the selection.
* ``micro_batch``: over each micro-batch as it is differentiated (the released code's scope).

The per-token formulas are the functions ``clip_cov`` and ``kl_cov``; the configured parts are the classes
``ClipCov`` and ``KLCov``, which carry the settings and the ``select`` step.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.registry import LOSSES

SCOPES = ("mini_batch", "micro_batch")


def _token_cov(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Centred product (A − mean A)(log π − mean log π) per token, means over the valid tokens."""
    m = mask.bool()
    count = m.sum().clamp(min=1)
    a_mean = (adv * m).sum() / count
    l_mean = (logp.detach() * m).sum() / count
    return (adv - a_mean) * (logp.detach() - l_mean)


def _surrogates(logp, old_logp, adv, eps_low, eps_high):
    ratio = torch.exp(logp - old_logp)
    return ratio, -adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high)


@torch.no_grad()
def clip_cov_selection(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(N, T) bool: the tokens Clip-Cov detaches. Candidates: valid, not clipped by the PPO clip, covariance in
    (cov_lb, cov_ub); max(⌊clip_ratio · #valid⌋, 1) of them drawn uniformly at random (all if fewer)."""
    adv = expand_like(advantages, logp).float()
    logp, old_logp = logp.float(), old_logp.float()
    _, l1, l2 = _surrogates(logp, old_logp, adv, eps_low, eps_high)
    valid = mask.bool()
    clipped_by_ppo = (l2 > l1) & valid
    cov = _token_cov(logp, adv, mask)
    candidates = ((cov > cov_lb) & (cov < cov_ub) & valid & ~clipped_by_ppo).nonzero()
    selected = torch.zeros_like(valid)
    n = max(int(clip_ratio * int(valid.sum())), 1)
    if len(candidates):
        perm = torch.randperm(len(candidates), generator=generator, device="cpu")[:n].to(candidates.device)
        chosen = candidates[perm]
        selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


def clip_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    selected: torch.Tensor | None = None,
) -> LossOutput:
    """Clip-Cov's per-token loss: the PPO clipped surrogate max(−A·r, −A·clip(r)), times 0 on the ``selected``
    tokens (``clip_cov_selection`` over these tensors when not given)."""
    if selected is None:
        selected = clip_cov_selection(
            logp, old_logp, advantages, mask, eps_low, eps_high, clip_ratio, cov_lb, cov_ub, generator
        )
    adv = expand_like(advantages, logp)
    ratio, l1, l2 = _surrogates(logp, old_logp, adv, eps_low, eps_high)
    keep = (~selected.bool()).to(ratio.dtype)
    loss = torch.maximum(l1, l2) * keep
    stats = ratio_stats(ratio, (ratio < 1 - eps_low) & (adv < 0), (ratio > 1 + eps_high) & (adv > 0))
    stats["cov/detached_frac"] = 1.0 - keep
    return LossOutput(loss, stats)


@torch.no_grad()
def kl_cov_selection(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, kl_ratio: float = 2e-3
) -> torch.Tensor:
    """(N, T) bool: the max(⌊kl_ratio · #valid⌋, 1) valid tokens of largest covariance (none without valid
    tokens)."""
    adv = expand_like(advantages, logp).float()
    valid = mask.bool()
    selected = torch.zeros_like(valid)
    if valid.any():
        cov = _token_cov(logp.float(), adv, mask).masked_fill(~valid, float("-inf"))
        k = max(int(kl_ratio * int(valid.sum())), 1)
        selected.view(-1)[torch.topk(cov.flatten(), k).indices] = True
    return selected


def kl_cov(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_ratio: float = 2e-3,
    kl_coef: float = 1.0,
    selected: torch.Tensor | None = None,
) -> LossOutput:
    """KL-Cov's per-token loss: the unclipped surrogate −A·r, plus kl_coef·|log r| on the ``selected`` tokens
    (``kl_cov_selection`` over these tensors when not given)."""
    if selected is None:
        selected = kl_cov_selection(logp, advantages, mask, kl_ratio)
    adv = expand_like(advantages, logp)
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    penalised = selected.to(ratio.dtype)
    loss = -adv * ratio + penalised * kl_coef * log_ratio.abs()
    zero = torch.zeros_like(ratio, dtype=torch.bool)
    stats = ratio_stats(ratio, zero, zero)
    stats["cov/penalised_frac"] = penalised
    return LossOutput(loss, stats)


def _check_scope(name: str, scope: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"algorithm.loss: {name}.scope={scope!r} is not one of {list(SCOPES)}")
    return scope


@LOSSES.register
class ClipCov:
    """Clip-Cov (see module doc): PPO-clip with a random few in-band high-covariance tokens detached."""

    def __init__(
        self,
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        clip_ratio: float = 2e-4,
        cov_lb: float = 1.0,
        cov_ub: float = 5.0,
        scope: str = "mini_batch",
    ):
        self.eps_low, self.eps_high, self.clip_ratio = float(eps_low), float(eps_high), float(clip_ratio)
        self.cov_lb, self.cov_ub, self.scope = float(cov_lb), float(cov_ub), _check_scope("ClipCov", scope)

    def select(self, logp, old_logp, advantages, mask) -> torch.Tensor:
        """(N, T) bool over the given tokens (the trainer passes a whole mini-batch)."""
        return clip_cov_selection(
            logp, old_logp, advantages, mask, self.eps_low, self.eps_high, self.clip_ratio, self.cov_lb, self.cov_ub
        )

    def __call__(self, logp, old_logp, advantages, mask, selected: torch.Tensor | None = None) -> LossOutput:
        if selected is None:
            selected = self.select(logp, old_logp, advantages, mask)
        return clip_cov(logp, old_logp, advantages, mask, self.eps_low, self.eps_high, selected=selected)


@LOSSES.register
class KLCov:
    """KL-Cov (see module doc): unclipped surrogate plus |log r| on the highest-covariance tokens."""

    def __init__(self, kl_ratio: float = 2e-3, kl_coef: float = 1.0, scope: str = "mini_batch"):
        self.kl_ratio, self.kl_coef, self.scope = float(kl_ratio), float(kl_coef), _check_scope("KLCov", scope)

    def select(self, logp, old_logp, advantages, mask) -> torch.Tensor:
        """(N, T) bool over the given tokens (the trainer passes a whole mini-batch)."""
        return kl_cov_selection(logp, advantages, mask, self.kl_ratio)

    def __call__(self, logp, old_logp, advantages, mask, selected: torch.Tensor | None = None) -> LossOutput:
        if selected is None:
            selected = self.select(logp, old_logp, advantages, mask)
        return kl_cov(logp, old_logp, advantages, mask, self.kl_ratio, self.kl_coef, selected=selected)
