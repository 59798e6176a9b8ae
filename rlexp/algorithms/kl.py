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

ESTIMATORS = ("k1", "k2", "k3", "abs")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1
    if estimator == "abs":
        return log_ratio.abs()
    raise ValueError(f"kl estimator {estimator!r} is not one of {ESTIMATORS}")
