"""KL estimators between the policy and a reference, per token (Schulman, "Approximating KL
Divergence", 2020). ``log_ratio`` = log π_ref − log π_θ on tokens sampled from π_θ.

* ``k1``  −log_ratio                (unbiased, high variance)
* ``k2``  ½·log_ratio²
* ``k3``  exp(log_ratio) − log_ratio − 1   (unbiased, low variance; GRPO's choice)
* ``abs`` |log_ratio|
No clamps by default (TRL's convention); ``clamp=True`` (``algorithm.kl.clamp``) gives verl's ``low_var_kl``:
k3 with the log-ratio clamped to [−20, 20] and the value to [−10, 10] (verl clamps no other estimator).
A trailing ``+`` (``k1+``, ``k3+``, ``abs+``; verl's names) keeps the estimator's value and takes k2's gradient
(straight-through: the gradient of ½·log_ratio² is the unbiased gradient of the KL).
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


ESTIMATORS = [*KL_ESTIMATORS.names(), *(f"{n}+" for n in KL_ESTIMATORS.names() if n != "k2")]


K3_LOG_RATIO_CLAMP, K3_VALUE_CLAMP = 20.0, 10.0  # verl's low_var_kl (verl/trainer/ppo/core_algos.py)


@REGULARISERS.register
def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3", clamp: bool = False) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) by the named estimator (``algorithm.kl``: a loss term or a reward penalty).
    ``clamp`` (k3 only): verl's clamps, log-ratio to ±20 and the estimate to ±10 (no gradient past them)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"kl estimator {estimator!r} is not one of {ESTIMATORS}")
    base = estimator.rstrip("+")
    if clamp and base != "k3":
        raise ValueError(f"algorithm.kl.clamp=true is verl's k3 (low_var_kl) clamp; estimator is {estimator!r}")
    log_ratio = ref_logp - logp
    if clamp:
        value = k3(log_ratio.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    else:
        value = KL_ESTIMATORS(base)(log_ratio)
    if base == estimator:
        return value
    grad = k2(log_ratio)  # straight-through: this value, k2's gradient (verl's "+" names)
    return grad - grad.detach() + value.detach()


@REGULARISERS.register
def kl_to_sampler(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_old) on tokens sampled from π_old (the rollout policy): with
    r = π_θ/π_old, ``r·log r − r + 1``. Unbiased (E_old[r log r] = KL(π_θ ‖ π_old), E_old[r − 1] = 0), ≥ 0,
    and its gradient r·log r·∇log π_θ is, in expectation, the exact gradient of KL(π_θ ‖ π_old); 0 with a 0
    gradient on-policy (r = 1). The k1–k3 estimators above assume tokens sampled from π_θ, which the rollout's
    tokens stop being after the first optimiser step. MDPO's proximity term."""
    log_r = logp - old_logp
    r = torch.exp(log_r)
    return r * log_r - r + 1
