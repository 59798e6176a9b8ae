"""Mirror-descent policy updates: MDPO ("Mirror Descent Policy Optimization", Tomar, Shani, Efroni and
Ghavamzadeh, 2020; arXiv 2005.09814), the on-policy variant.

Each rollout's update approximately solves the trust-region problem
    max_θ  E_old[r_t·A_t] − (1/t_k)·KL(π_θ ‖ π_old)
by several gradient steps on the same batch, starting from π_old (the policy that sampled it), in place
of PPO's clip. The released code (manantomar/Mirror-Descent-Policy-Optimization, mdpo_on/mdpo.py,
``method="multistep-SGD"``) anneals the mirror-descent step size t_k = 1 − (k − 1)/K over the K updates of
training (so the KL weight 1/t_k grows from 1), takes the analytic KL of its Gaussian policies, and keeps
old = the sampling policy, synced once per rollout.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.algorithms.regularisers.kl import kl_to_sampler
from rlexp.core.masks import PRECEDENT
from rlexp.core.registry import LOSSES


@LOSSES.register
class MirrorDescent:
    """MDPO's loss: ℓ_t = −r_t·A + (1/t_k)·KL_t with r_t = π_θ/π_old and KL_t = r·log r − r + 1, the
    per-token estimate of KL(π_θ ‖ π_old) on the sampled tokens (``regularisers.kl.kl_to_sampler``; the
    paper's Gaussian policies use the closed form). No clip. On the first step of a rollout (θ = old) the KL
    term and its gradient vanish and the loss is the policy gradient; it acts from the second step on.

    ``step_size``: t (t_0 with ``anneal``). ``anneal``: t_k = t·(1 − (k − 1)/K) at train step k of K
    (``trainer.max_steps``; the released code's schedule), floored at ``min_step_size``; the trainer calls
    ``on_step(k, K)`` before each update, so a resumed run takes the same weights."""

    def __init__(self, step_size: float = 1.0, anneal: bool = True, min_step_size: float = 1e-3):
        if step_size <= 0 or min_step_size <= 0:
            raise ValueError(f"loss MirrorDescent step_size={step_size}, min_step_size={min_step_size} must be > 0")
        self.step_size, self.anneal, self.min_step_size = float(step_size), bool(anneal), float(min_step_size)
        self.current = self.step_size  # t_k of the update in progress

    def on_step(self, step: int, max_steps: int) -> None:
        """Set t_k for train step ``step`` (1-based) of ``max_steps``."""
        t = self.step_size
        if self.anneal and max_steps > 0:
            t = t * (1.0 - (step - 1) / max_steps)
        self.current = max(t, self.min_step_size)

    def __call__(self, logp, old_logp, advantages, mask) -> LossOutput:
        adv = expand_like(advantages, logp)
        ratio = torch.exp(logp - old_logp)
        kl = kl_to_sampler(logp, old_logp)
        per_token = -ratio * adv + kl / self.current
        stats = {
            "mdpo/kl": kl.detach(),
            "mdpo/kl_coef": torch.full_like(kl, 1.0 / self.current).detach(),
            "ratio/mean": ratio.detach(),
        }
        return LossOutput(per_token, stats)


@LOSSES.register
class PrecedentKL:
    """A policy loss plus a KL term to the precedent policy (the weights the step's update starts from):
    ℓ_t = inner_t + ``coef``·KL_t(π_θ ‖ π_prev), KL_t = r·log r − r + 1 with r = π_θ/π_prev
    (``regularisers.kl.kl_to_sampler``). With the algorithm's KL to the reference (the base model) at
    ``kl.coef`` = β·λ and ``coef`` = β·(1 − λ), this is ReMix's KL-Convex policy constraint ("Squeeze the Soaked
    Sponge: Efficient Off-policy Reinforcement Finetuning for Large Language Model", Liang et al., 2025; arXiv
    2507.06892): a convex combination of the constraints to the base and to the precedent model. π_prev differs
    from the ratio's denominator on replayed rows (theirs is the policy that sampled them); 0 with a 0 gradient on
    the first optimiser step of a rollout. Stats: ``kl_convex/precedent_kl``."""

    batch_extras = (PRECEDENT,)

    def __init__(self, inner, coef: float = 0.0):
        if coef < 0:
            raise ValueError(f"loss PrecedentKL.coef={coef} must be >= 0")
        self.inner, self.coef = inner, float(coef)

    def __call__(self, logp, old_logp, advantages, mask, precedent_logprobs=None) -> LossOutput:
        out = self.inner(logp, old_logp, advantages, mask)
        prev = old_logp if precedent_logprobs is None else precedent_logprobs
        kl = kl_to_sampler(logp, prev)
        stats = {**out.token_stats, "kl_convex/precedent_kl": kl.detach()}
        return LossOutput(out.per_token + self.coef * kl, stats)
