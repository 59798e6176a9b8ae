"""Reward perturbation — the perturbation study of "The Policy Cliff: A Theoretical Analysis of Reward-Policy Maps in
Large Language Models" (Xu, 2025; arXiv 2507.20150). The paper proves that the map from a reward to its optimal
policy is discontinuous where optimal actions are not unique (a small change of the reward can flip the policy: the
"cliff"), and that entropy regularisation makes it continuous again at the cost of a more stochastic policy.
``RewardPerturbation`` makes the small change: it adds a seeded perturbation δ to the total reward, so a sweep over
its ``scale`` and ``algorithm.entropy_coef`` shows how far the trained policy moves.

``mode``:
  ``gaussian``   δ_i = scale·z_i, z_i ~ N(0, 1) drawn afresh for each row at each step (a noisy reward);
  ``uniform``    δ_i = scale·u_i, u_i ~ U(−1, 1) (bounded noise);
  ``systematic`` δ_i = scale·z(prompt), one N(0, 1) draw per prompt, fixed for the whole run (a reward model that is
                 consistently off on some prompts: the same perturbed reward function at every step).
The draws are seeded by ``seed`` (null: the run's trainer.seed) and the step (the prompt's text for ``systematic``),
so two runs with the same seed see the same perturbation. δ is appended as a reward column of its own (weight 1,
``reward/policy_cliff/perturbation/mean`` in the metrics), so the total reward moves by δ while the accuracy metric and
every other term stay those of the clean reward.
"""

from __future__ import annotations

import hashlib

import torch

from rlexp.algorithms.group_stages.base import append_reward_column, stage_setting
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

MODES = ("gaussian", "uniform", "systematic")
COLUMN = "policy_cliff/perturbation"


def _prompt_seed(seed: int, record: dict, prompt: str) -> int:
    key = record.get("id") if isinstance(record, dict) else None
    if key is None:
        key = record.get("question", prompt) if isinstance(record, dict) else prompt
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@GROUP_STAGES.register
class RewardPerturbation:
    """Group stage: add a seeded perturbation of size ``scale`` to the reward, as a reward column of its own
    (``policy_cliff/perturbation``, weight 1), so the accuracy and the other terms' metrics stay those of the clean
    reward; see the module doc for ``mode``. Metrics: ``policy_cliff/perturbation_abs_mean`` (mean |δ|),
    ``policy_cliff/perturbation_mean`` (mean δ) and ``policy_cliff/scale``."""

    needs_reference = False

    def __init__(self, scale: float = 0.1, mode: str = "gaussian", seed: int | None = None):
        where = "algorithm.group_stages: RewardPerturbation"
        if scale < 0:
            raise ValueError(f"{where}.scale={scale} must be >= 0")
        if mode not in MODES:
            raise ValueError(f"{where}.mode={mode!r} is not one of {list(MODES)}")
        self.scale, self.mode = float(scale), mode
        self.seed = None if seed is None else int(seed)

    def draws(self, batch: RolloutBatch, step: int, seed: int) -> torch.Tensor:
        """(N,) standard draws (before ``scale``) of the step."""
        n = len(batch)
        if self.mode == "systematic":
            out = torch.empty(n)
            for i in range(n):
                g = torch.Generator().manual_seed(_prompt_seed(seed, batch.records[i], batch.prompts[i]))
                out[i] = torch.randn(1, generator=g)[0]
            return out
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        if self.mode == "gaussian":
            return torch.randn(n, generator=g)
        return 2.0 * torch.rand(n, generator=g) - 1.0

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        step = int(getattr(ctx, "step", 0) or 0)
        seed = self.seed if self.seed is not None else int(stage_setting(ctx, "seed", 0))
        delta = self.scale * self.draws(batch, step, seed)
        append_reward_column(batch, COLUMN, delta, 1.0)
        batch.stats["policy_cliff/perturbation_abs_mean"] = float(delta.abs().mean())
        batch.stats["policy_cliff/perturbation_mean"] = float(delta.mean())
        batch.stats["policy_cliff/scale"] = self.scale
        return batch
