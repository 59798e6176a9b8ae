"""Contrastive policy gradient: CoPG ("Contrastive Policy Gradient: Aligning LLMs on sequence-level scores in a
supervised-friendly fashion", Flet-Berliac et al., 2024; arXiv 2406.19185).

For two completions y, y' of one prompt, drawn from any behaviour policy μ, with the regularised reward
R^β_π(y) = R(y) − β·ln π(y)/π_ref(y) (sequence log-probs), CoPG minimises the regression loss
    ℓ(y, y'; π) = (R(y) − R(y') − β·(h(y) − h(y')))² / (2β),    h = ln π/π_ref,
whose gradient is −(R^β_π(y) − R^β_π(y'))·(∇ln π(y) − ∇ln π(y')): each completion is pushed by its
regularised reward against its partner's — a policy gradient whose baseline is the other sample, with no
importance weight, valid off-policy (its fixed point is π* ∝ π_ref·exp(R/β)). With β = 0 it is the policy
gradient with a leave-one-out baseline; with rewards ±1/2 it is IPO. Over a group of G completions we take
every pair, so completion i gets the coefficient R^β_i − mean_{j≠i} R^β_j (one ordered pair per peer, a
constant rescaling of the pair sum). No released code was found; the loss is as the paper states it.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.registry import LOSSES
from rlexp.core.stats import group_stats


def peer_contrast(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(N,) v_i − mean_{j≠i, same group} v_j; 0 for a completion without peers."""
    mean, _, count = group_stats(values, group_ids)
    out = (values.float() - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, out, torch.zeros_like(out))


@LOSSES.register
class ContrastivePG:
    """CoPG's loss (see module doc) as a surrogate: ℓ_t = −sg(A_i)·log π_θ(y_{i,t}) summed over the tokens of
    completion i (``aggregation: seq-mean-token-sum``), with A_i = ``advantages``_i − β·(h_i − mean_{j≠i} h_j),
    h = Σ_t (log π_θ − log π_ref) at the current weights. Given the leave-one-out reward contrast as
    ``advantages`` (``advantages.leave_one_out.rloo``), A_i is the pairwise CoPG coefficient; its gradient equals
    that of the squared pair loss. The trainer calls ``select`` on each optimiser step's whole mini-batch (whole
    groups) with the current log-probs and the batch (group ids, reference log-probs), so h is always the
    current policy's, not the rollout's. ``old_logp`` is not used (no importance sampling)."""

    scope = "mini_batch"
    needs_batch = True

    def __init__(self, beta: float = 0.0):
        if beta < 0:
            raise ValueError(f"loss ContrastivePG beta={beta} must be >= 0")
        self.beta = float(beta)

    @property
    def needs_reference(self) -> bool:
        return self.beta > 0

    def select(self, logp, old_logp, advantages, mask, batch=None) -> torch.Tensor:
        """(N, T) the CoPG coefficient of each row, repeated over its tokens, from the current log-probs ``logp``
        of whole groups; ``batch`` gives ``group_ids`` and ``ref_logprobs``."""
        adv = advantages.float()
        if adv.dim() != 1:
            raise ValueError("loss ContrastivePG needs one advantage per sequence (N,), got token-level advantages")
        if self.beta > 0:
            if batch is None or batch.ref_logprobs is None:
                raise ValueError("loss ContrastivePG with beta > 0 needs the batch's group ids and reference log-probs")
            m = mask.to(logp.dtype)
            h = ((logp.detach() - batch.ref_logprobs) * m).sum(-1)
            adv = adv - self.beta * peer_contrast(h, batch.group_ids)
        return adv[:, None].expand_as(logp).contiguous()

    def __call__(self, logp, old_logp, advantages, mask, selected: torch.Tensor | None = None) -> LossOutput:
        if selected is None:
            if self.beta > 0:
                raise ValueError("loss ContrastivePG with beta > 0 needs its coefficients from select()")
            selected = expand_like(advantages.float(), logp)
        coef = selected.detach()
        per_token = -coef * logp
        base = expand_like(advantages.float(), logp)
        stats = {
            "copg/coef_abs": coef.abs(),
            "copg/kl_term_abs": (coef - base).abs(),  # |β·(h_i − mean_{j≠i} h_j)|: the regularisation acting
            "ratio/mean": torch.exp(logp - old_logp).detach(),  # reported only: CoPG takes no importance weight
        }
        return LossOutput(per_token, stats)
