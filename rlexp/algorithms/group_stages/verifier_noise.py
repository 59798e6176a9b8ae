"""Imperfect verifiers — "Reinforcement Learning with Verifiable yet Noisy Rewards under Imperfect Verifiers" (Cai et
al., 2025; arXiv 2510.00915): a binary verifier reward R̃ that flips the true R* with a false-positive rate
ρ0 = P(R̃ = 1 | R* = 0) and a false-negative rate ρ1 = P(R̃ = 0 | R* = 1).

``VerifierNoise`` can inject such noise (the paper's synthetic setting: each row's term flipped at random with those
rates, seeded by run seed and step) and apply the paper's backward correction R̂ = (R̃ − ρ0) / (1 − ρ0 − ρ1), an
unbiased estimate of R* (E[R̂ | R*] = R*). The corrected value replaces the term's column and the total reward is
updated by its weight. Group-normalised advantages are invariant to this affine map within a group; it changes the
update where rewards are not standardised per group (Dr. GRPO, REINFORCE, a KL or other terms beside it).
"""

from __future__ import annotations

import torch

from rlexp.algorithms.group_stages.base import stage_setting
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

CORRECTIONS = ("none", "backward")


@GROUP_STAGES.register
class VerifierNoise:
    """Group stage: inject (``inject: true``) and/or correct (``correction: backward``) verifier noise on the binary
    reward term ``term`` with rates ρ0 (false positive) and ρ1 (false negative).

    Metrics: ``verifier_noise/flipped_frac`` (rows whose reward the injection flipped),
    ``verifier_noise/corrected_mean`` (the term's mean after the correction)."""

    needs_reference = False

    def __init__(
        self,
        term: str = "accuracy",
        rho0: float = 0.0,
        rho1: float = 0.0,
        inject: bool = False,
        correction: str = "backward",
    ):
        if not (0.0 <= rho0 < 0.5 and 0.0 <= rho1 < 0.5):
            raise ValueError(
                f"algorithm.group_stages: VerifierNoise rates rho0={rho0}, rho1={rho1} must be in [0, 0.5)"
            )
        if correction not in CORRECTIONS:
            raise ValueError(
                f"algorithm.group_stages: VerifierNoise.correction={correction!r} is not one of {CORRECTIONS}"
            )
        self.term, self.rho0, self.rho1 = term, float(rho0), float(rho1)
        self.inject, self.correction = bool(inject), correction

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        if self.term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: VerifierNoise.term={self.term!r} is not a reward term "
                f"(terms: {batch.reward_names})"
            )
        j = batch.reward_names.index(self.term)
        old = batch.rewards[:, j].clone()
        observed = (old >= 0.5).float()
        if self.inject:
            step = int(getattr(ctx, "step", 0) or 0)
            seed = int(stage_setting(ctx, "seed", 0))
            g = torch.Generator().manual_seed(seed * 1_000_003 + step)
            u = torch.rand(len(observed), generator=g).to(observed.device)
            flip = torch.where(observed > 0, u < self.rho1, u < self.rho0)
            observed = torch.where(flip, 1.0 - observed, observed)
            batch.stats["verifier_noise/flipped_frac"] = float(flip.float().mean())
        value = observed
        if self.correction == "backward":
            value = (observed - self.rho0) / (1.0 - self.rho0 - self.rho1)
        value = value.to(batch.rewards.dtype)
        batch.rewards[:, j] = value
        weight = float(batch.reward_weights[j]) if batch.reward_weights is not None else 1.0
        batch.reward = batch.reward + weight * (value - old).to(batch.reward.dtype)
        batch.stats["verifier_noise/corrected_mean"] = float(value.mean())
        return batch
