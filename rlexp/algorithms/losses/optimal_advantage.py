"""A*-PO's optimal advantage regression — "Accelerating RL for LLM Reasoning with Optimal Advantage Regression"
(Brantley et al., 2025; arXiv 2505.20686; released code ZhaolinGao/A-PO, ``verl/trainer/apo/core_algos.py``
``compute_policy_loss``).

With one sample y per prompt x from the current policy and the optimal value V*(x) estimated from reference samples
(``group_stages.optimal_value``), A*-PO regresses the policy's scaled sequence log-ratio to the reference onto the
optimal advantage:

    ℓ(x, y) = ( β2 · log π_θ(y|x)/π_ref(y|x) − (r(x, y) − V*(x)) )²,   log π/π_ref = Σ_t (log π_θ − log π_ref),

averaged over the sampled sequences (the release: β2 = 1e-3, sequence sums of the response tokens' log-probs,
``loss.mean()`` over the micro-batch). The target A = r − V* comes in as the advantage
(``advantages.baselines.remax`` with ``key: v_star``); the reference log-probs come from the trainer (the loss is
marked ``needs_reference``, and ``takes_ref_logp``: ``Algorithm.token_loss`` hands it ``ref_logp``). No importance
ratio: the loss is a regression at the current weights, valid on any mini-batch.

Per token the loss is the row's squared residual e_i² on each of its valid tokens, so the method's
``aggregation: seq-mean-token-mean`` (required) gives mean_i e_i², whose gradient is 2·β2·e_i·∇Σ_t log π_θ.
Stats (token means over the valid tokens): ``a_star_po/regression_residual`` (|e_i|), ``a_star_po/squared_residual``
(e_i²), ``a_star_po/log_ratio`` (Σ_t log π_θ/π_ref of the row), ``a_star_po/target`` (r − V*).
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput
from rlexp.core.registry import LOSSES


def regression_residual(
    logp: torch.Tensor, ref_logp: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, beta2: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) e_i = β2·h_i − target_i and (N,) h_i = Σ_t (logp − ref_logp) over the row's valid tokens (mask > 0);
    gradient through ``logp`` only."""
    valid = (mask > 0).to(logp.dtype)
    h = ((logp - ref_logp.detach().to(logp.dtype)) * valid).sum(-1)
    return beta2 * h - target.to(h.dtype), h


@LOSSES.register
class OptimalAdvantageRegression:
    """A*-PO's least-squares loss (see the module doc). ``beta2``: β2 > 0, the KL-regularisation strength of the
    learned policy (the release's 1e-3). ``advantages``: (N,) the target r − V*."""

    needs_reference = True
    takes_ref_logp = True
    required_aggregation = "seq-mean-token-mean"

    def __init__(self, beta2: float = 1e-3):
        if not isinstance(beta2, (int, float)) or isinstance(beta2, bool) or not beta2 > 0:
            raise ValueError(f"algorithm.loss (OptimalAdvantageRegression) beta2={beta2!r} must be > 0")
        self.beta2 = float(beta2)

    def __call__(self, logp, old_logp, advantages, mask, ref_logp: torch.Tensor | None = None) -> LossOutput:
        if ref_logp is None:
            raise ValueError("algorithm.loss (OptimalAdvantageRegression) needs the reference log-probs (ref_logp)")
        if advantages.dim() != 1:
            raise ValueError(
                "algorithm.loss (OptimalAdvantageRegression) regresses one target per sequence (N,), got token-level "
                "advantages"
            )
        residual, h = regression_residual(logp, ref_logp, advantages.float(), mask, self.beta2)
        per_token = (residual**2)[:, None].expand_as(logp)
        e = residual.detach()[:, None].expand_as(logp)
        stats = {
            "a_star_po/regression_residual": e.abs(),
            "a_star_po/squared_residual": e**2,
            "a_star_po/log_ratio": h.detach()[:, None].expand_as(logp),
            "a_star_po/target": advantages.detach().float()[:, None].expand_as(logp),
        }
        return LossOutput(per_token, stats)
