"""KL estimators between the policy and a reference, per token (Schulman, "Approximating KL
Divergence", 2020). ``log_ratio`` = log π_ref − log π_θ on tokens sampled from π_θ.

* ``k1``  −log_ratio                (unbiased, high variance)
* ``k2``  ½·log_ratio²
* ``k3``  exp(log_ratio) − log_ratio − 1   (unbiased, low variance; GRPO's choice)
* ``abs`` |log_ratio|
No clamps (TRL's convention; verl clamps k3 to ≤ 10).
"""

from __future__ import annotations

import torch

from rlexp.core.registry import KL_ESTIMATORS, REGULARISERS


@KL_ESTIMATORS.register
def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """−log_ratio: unbiased, high variance."""
    return -log_ratio


@KL_ESTIMATORS.register
def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """½·log_ratio²."""
    return 0.5 * log_ratio**2


@KL_ESTIMATORS.register
def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(log_ratio) − log_ratio − 1: unbiased, low variance (GRPO's choice)."""
    return torch.exp(log_ratio) - log_ratio - 1


@KL_ESTIMATORS.register(name="abs")
def absolute(log_ratio: torch.Tensor) -> torch.Tensor:
    """|log_ratio|."""
    return log_ratio.abs()


ESTIMATORS = KL_ESTIMATORS.names()


@REGULARISERS.register
def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) by the named estimator (``algorithm.kl``: a loss term or a reward penalty)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator {estimator!r} is not one of {ESTIMATORS}")
    return KL_ESTIMATORS(estimator)(ref_logp - logp)
