"""Pairwise preference losses on the step's own pairs (issue 24's online pairwise family).

The pairs come from ``group_stages.preference.PairwisePreference`` (``batch.extras["pairs"]``: +1 at [i, k] when
completion i beats the k-th completion of its group). Each loss is a function ℓ(x) of a pair's margin
x = s_w − s_l between sequence scores of the winner and the loser, averaged over the mini-batch's pairs. Like CoPG
(``losses.contrastive``), it is trained through an exact surrogate: on each optimiser step the trainer calls
``select`` on the whole mini-batch (whole groups) with the current log-probs, which gives each row the coefficient
c_i = −(N / P) Σ_{pairs ∋ i} ∂ℓ/∂s_i (N rows, P pairs); the per-token loss −c_i·log π_θ(y_{i,t}), summed over a
row's tokens and averaged over rows (``aggregation: seq-mean-token-sum``), then has the gradient of the mean pair
loss. The pair losses' own means (loss, margin, accuracy: the share of pairs with x > 0) are this step's
``select_stats``.

Sequence scores s = Σ_t (log π_θ − log π_base) over the completion, with π_base:
* ``ref``: the frozen reference (``batch.ref_logprobs``): DPO/IPO ("Direct Preference Optimization", Rafailov et
  al., 2023; "A General Theoretical Paradigm to Understand Learning from Human Preferences", Azar et al., 2023).
* ``rollout``: the policy that sampled the step (the old log-probs): DNO's reference π_t, the previous iterate
  ("Direct Nash Optimization", Rosset et al., 2024). With one optimiser step per rollout it is 0 and the loss is
  a pairwise policy gradient; the method needs several optimiser steps per rollout.
* ``none``: s = α·Σ_t log π_θ: CPL ("Contrastive Preference Learning", Hejna et al., 2023), whose conservative
  bias λ scales the loser's score: x = α(S_w − λ·S_l).

Loss types: ``sigmoid`` ℓ = −log σ(β·x) (DPO); ``ipo`` ℓ = (x − 1/(2τ))² (IPO, τ = ``beta``); CPL is ``sigmoid``
with β = 1 on its α-scaled scores.

TRPA ("Trust Region Preference Approximation", Su et al., 2025) adds two settings: ``anisotropy`` κ multiplies β of
the pairs whose winner's reward is at least ``anisotropy_from`` (its top preference level), and ``trust_region``
adds a k3 KL to the rollout policy per token, coef·(π_old/π − 1 − log(π_old/π)) (``trust_region/kl``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlexp.algorithms.group_stages.preference import PAIRS, group_positions
from rlexp.algorithms.losses.base import LossOutput
from rlexp.core.registry import LOSSES

LOSS_TYPES = ("sigmoid", "ipo")
BASES = ("ref", "rollout", "none")


def pair_index(pairs: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(winner rows, loser rows) of the chosen pairs in an (N, W) pair matrix over contiguous groups."""
    _, start, _ = group_positions(group_ids)
    w, col = torch.nonzero(pairs > 0, as_tuple=True)
    return w, start[w] + col


def pair_loss(x: torch.Tensor, loss_type: str, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """(ℓ(x), dℓ/dx) per pair; ``beta`` a number or one per pair."""
    if loss_type == "sigmoid":
        return -F.logsigmoid(beta * x), -beta * torch.sigmoid(-beta * x)
    target = 1.0 / (2.0 * beta)
    return (x - target) ** 2, 2.0 * (x - target)


@LOSSES.register
class PairwisePreferenceLoss:
    """The mean pair loss over the step's chosen pairs (module doc). ``beta``: DPO's β, or IPO's τ; ``base``: the
    policy the scores are measured against (ref | rollout | none); ``alpha`` and ``conservative``: CPL's α and λ
    (``base=none`` only); ``length_normalise``: scores are token means instead of sums (TRL's IPO)."""

    scope = "mini_batch"
    needs_batch = True

    def __init__(
        self,
        loss_type: str = "sigmoid",
        beta: float = 0.1,
        base: str = "ref",
        alpha: float = 1.0,
        conservative: float = 1.0,
        length_normalise: bool = False,
        anisotropy: float = 1.0,
        anisotropy_from: float | None = None,
        trust_region: float = 0.0,
    ):
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"algorithm.loss.loss_type={loss_type!r} is not one of {list(LOSS_TYPES)}")
        if base not in BASES:
            raise ValueError(f"algorithm.loss.base={base!r} is not one of {list(BASES)}")
        if beta <= 0:
            raise ValueError(f"algorithm.loss.beta={beta} must be > 0")
        if alpha <= 0 or conservative <= 0:
            raise ValueError(f"algorithm.loss.alpha={alpha} and .conservative={conservative} must be > 0")
        if base != "none" and (alpha != 1.0 or conservative != 1.0):
            raise ValueError("algorithm.loss.alpha and .conservative are CPL's (base=none) and must stay 1 otherwise")
        if anisotropy <= 0 or (anisotropy != 1.0 and anisotropy_from is None):
            raise ValueError(
                "algorithm.loss.anisotropy must be > 0 and, when not 1, needs algorithm.loss.anisotropy_from"
            )
        if trust_region < 0:
            raise ValueError(f"algorithm.loss.trust_region={trust_region} must be >= 0")
        self.anisotropy, self.anisotropy_from, self.trust_region = (
            float(anisotropy),
            anisotropy_from,
            float(trust_region),
        )
        self.loss_type, self.beta, self.base = loss_type, float(beta), base
        self.alpha, self.conservative, self.length_normalise = float(alpha), float(conservative), length_normalise
        self.select_stats: dict[str, float] = {}

    @property
    def needs_reference(self) -> bool:
        return self.base == "ref"

    def scores(self, logp, old_logp, mask, batch) -> torch.Tensor:
        """(N,) sequence scores s_i at the current weights (no gradient)."""
        m = mask.to(logp.dtype)
        if self.base == "ref":
            if batch is None or batch.ref_logprobs is None:
                raise ValueError("algorithm.loss.base=ref needs the reference log-probs (algorithm.reference)")
            diff = logp.detach() - batch.ref_logprobs
        elif self.base == "rollout":
            diff = logp.detach() - old_logp
        else:
            diff = self.alpha * logp.detach()
        s = (diff * m).sum(-1)
        return s / m.sum(-1).clamp(min=1) if self.length_normalise else s

    def select(self, logp, old_logp, advantages, mask, batch=None) -> torch.Tensor:
        """(N, T) each row's coefficient c_i (module doc), repeated over its tokens."""
        if batch is None or PAIRS not in batch.extras:
            raise ValueError(
                "algorithm.loss PairwisePreferenceLoss reads batch.extras['pairs']: put the group stage "
                "rlexp.algorithms.group_stages.preference.PairwisePreference in algorithm.group_stages"
            )
        s = self.scores(logp, old_logp, mask, batch)
        w, l = pair_index(batch.extras[PAIRS], batch.group_ids)
        coef = torch.zeros_like(s)
        if w.numel():
            lam = self.conservative if self.base == "none" else 1.0
            x = s[w] - lam * s[l]
            beta = torch.full_like(x, self.beta)
            if self.anisotropy != 1.0:
                top = batch.reward.to(x.device)[w] >= self.anisotropy_from
                beta = torch.where(top, beta * self.anisotropy, beta)
            value, grad = pair_loss(x, self.loss_type, beta)
            scale = len(s) / w.numel()
            coef.index_add_(0, w, -scale * grad)
            coef.index_add_(0, l, scale * lam * grad)
            self.select_stats = {
                "pref/pair_loss": float(value.mean()),
                "pref/margin": float(x.mean()),
                "pref/pair_accuracy": float((x > 0).float().mean()),
                "pref/pairs": float(w.numel()),
            }
        else:
            self.select_stats = {"pref/pairs": 0.0}
        if self.length_normalise:
            coef = coef / mask.to(coef.dtype).sum(-1).clamp(min=1)
        if self.base == "none":
            coef = coef * self.alpha
        return coef[:, None].expand_as(logp).contiguous()

    def __call__(self, logp, old_logp, advantages, mask, selected: torch.Tensor | None = None) -> LossOutput:
        if selected is None:
            raise ValueError("algorithm.loss PairwisePreferenceLoss needs its coefficients from select()")
        coef = selected.detach()
        per_token = -coef * logp
        stats = {"pref/coef_abs": coef.abs(), "ratio/mean": torch.exp(logp - old_logp).detach()}
        if self.trust_region > 0:
            log_r = old_logp - logp  # k3 of KL(π_θ ‖ π_old), r = π_old/π_θ
            kl = torch.exp(log_r) - log_r - 1.0
            per_token = per_token + self.trust_region * kl
            stats["trust_region/kl"] = kl.detach()
        return LossOutput(per_token, stats)
