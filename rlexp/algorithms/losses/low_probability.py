"""Lp-Reg — "Low-probability Tokens Sustain Exploration in Reinforcement Learning with Verifiable Reward" (2025; arXiv
2510.03222; released code CarlanLark/Lp-Reg-dev, ``compute_policy_loss_lp_reg``).

Negative-advantage updates drive down the probability of rare but valid tokens ("reasoning sparks") until exploration
dies. Lp-Reg regularises those tokens toward a proxy of the old policy that keeps only the plausible tokens: the
min-p proxy π_proxy renormalises the old policy on the tokens with p ≥ κ·max p (``rlexp.core.forward.
minp_proxy_logprobs``; filtered tokens are presumed noise and get −1e4). Among the micro-batch's tokens with A < 0,
the k = max(1, ⌊ρ·N_neg⌋) with the lowest current log-prob are selected (the regulariser acts only when k > 1, as
the released code), and of those the ones the proxy still gives more probability than the policy
(log π_θ < log π_proxy). Their loss is the unclipped −A·r plus β·k3, with k3 = exp(Δ) − Δ − 1, Δ = log π_proxy −
log π_θ, clamped to ±10 (the low-variance estimate of KL(π_θ ‖ π_proxy)); every other token takes the clipped
surrogate.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like, ratio_stats
from rlexp.core.masks import PROXY_LOGPROBS
from rlexp.core.registry import LOSSES


@LOSSES.register
class LpReg:
    """The clipped surrogate with Lp-Reg's KL to the min-p proxy on the lowest-probability negative tokens."""

    batch_extras = (PROXY_LOGPROBS,)

    def __init__(
        self,
        minp: float = 0.02,
        rho: float = 0.01,
        beta: float = 1.0,
        eps_low: float = 1.0,
        eps_high: float = 9.0,
        kl_clamp: float = 10.0,
    ):
        if not 0.0 < minp < 1.0:
            raise ValueError(f"algorithm.loss.minp={minp} must be in (0, 1)")
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"algorithm.loss.rho={rho} must be in (0, 1]")
        if beta < 0:
            raise ValueError(f"algorithm.loss.beta={beta} must be >= 0")
        self.minp, self.rho, self.beta = float(minp), float(rho), float(beta)
        self.eps_low, self.eps_high, self.kl_clamp = float(eps_low), float(eps_high), float(kl_clamp)

    def select(self, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, proxy: torch.Tensor) -> torch.Tensor:
        """(N, T) bool: the regularised tokens (see the module doc)."""
        neg = (adv < 0) & mask.bool()
        n_neg = int(neg.sum())
        k = max(1, int(self.rho * n_neg))
        chosen = torch.zeros_like(neg)
        if n_neg == 0 or k <= 1:
            return chosen
        scores = logp.detach().masked_fill(~neg, float("inf")).flatten()
        idx = scores.topk(k, largest=False).indices
        chosen.view(-1)[idx] = True
        return chosen & (logp.detach() < proxy)

    def __call__(self, logp, old_logp, advantages, mask, proxy_logprobs) -> LossOutput:
        adv = expand_like(advantages, logp)
        ratio = torch.exp(logp - old_logp)
        clipped = ratio.clamp(1 - self.eps_low, 1 + self.eps_high)
        surrogate = -torch.min(ratio * adv, clipped * adv)
        chosen = self.select(logp, adv, mask, proxy_logprobs)
        delta = (proxy_logprobs - logp).clamp(-50, 50)
        k3 = (torch.exp(delta) - delta - 1).clamp(-self.kl_clamp, self.kl_clamp)
        loss = torch.where(chosen, -ratio * adv + self.beta * k3, surrogate)
        low = (ratio < 1 - self.eps_low) & (adv < 0)
        high = (ratio > 1 + self.eps_high) & (adv > 0)
        stats = ratio_stats(ratio, low, high)
        stats["lp_reg/selected_frac"] = chosen.float()
        stats["lp_reg/kl"] = k3.detach() * chosen
        return LossOutput(loss, stats)
