"""Lagrangian reward weights — "Confronting Reward Model Overoptimization with Constrained RLHF" (Moskovitz et al.,
2023; arXiv 2310.04373): each constrained reward term i has a threshold θ_i and a Lagrange multiplier μ_i ≥ 0 that
the training learns alongside the policy (primal-dual).

A ``max`` constraint (E[r_i] ≤ θ_i, the paper's "threshold of usefulness" past which a component reward model is
over-optimised) subtracts μ_i·r_i from the reward; a ``min`` constraint (E[r_i] ≥ θ_i) adds μ_i·r_i. After the step's
rewards are formed with the current multipliers, each moves by a projected gradient step on the dual,

    μ_i ← max(0, μ_i + η·(mean r_i − θ_i))   (max)        μ_i ← max(0, μ_i + η·(θ_i − mean r_i))   (min)

so a violated constraint weighs more at the next step and a slack one fades to 0. The stage appends one reward column
per constraint, ``lagrange/<term>`` = ±r_i with weight μ_i (the multiplier in use, visible in the reward terms).
"""

from __future__ import annotations

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

DIRECTIONS = ("max", "min")


@GROUP_STAGES.register
class LagrangianWeights:
    """Group stage: reward terms kept under (``max``) or over (``min``) thresholds by learned Lagrange multipliers.

    ``constraints``: a list of {term, threshold, direction (max | min), init (μ₀, default 0)}; ``lr``: the dual step
    η. Metrics: ``lagrange/<term>/multiplier`` (μ used at the step), ``lagrange/<term>/violation`` (mean r − θ for
    max, θ − mean r for min; > 0: violated). The multipliers are kept in checkpoints."""

    needs_reference = False

    def __init__(self, constraints: list, lr: float = 0.1):
        if lr <= 0:
            raise ValueError(f"algorithm.group_stages: LagrangianWeights.lr={lr} must be > 0")
        if not constraints:
            raise ValueError("algorithm.group_stages: LagrangianWeights.constraints is empty")
        self.constraints = []
        for i, c in enumerate(constraints):
            c = dict(c)
            where = f"algorithm.group_stages: LagrangianWeights.constraints[{i}]"
            if "term" not in c or "threshold" not in c:
                raise ValueError(f"{where} needs a term and a threshold, got {c}")
            direction = c.get("direction", "max")
            if direction not in DIRECTIONS:
                raise ValueError(f"{where}.direction={direction!r} is not one of {list(DIRECTIONS)}")
            init = float(c.get("init", 0.0))
            if init < 0:
                raise ValueError(f"{where}.init={init} must be >= 0")
            self.constraints.append((str(c["term"]), float(c["threshold"]), direction))
        self.lr = float(lr)
        self.multipliers = {
            term: float(dict(c).get("init", 0.0)) for c, (term, _, _) in zip(constraints, self.constraints)
        }

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        for term, threshold, direction in self.constraints:
            if term not in batch.reward_names:
                raise KeyError(
                    f"algorithm.group_stages: LagrangianWeights constrains {term!r}, not a reward term "
                    f"(terms: {batch.reward_names})"
                )
            r = batch.term(term).float()
            sign = -1.0 if direction == "max" else 1.0
            mu = self.multipliers[term]
            append_reward_column(batch, f"lagrange/{term}", sign * r, mu)
            mean = float(r.mean())
            violation = mean - threshold if direction == "max" else threshold - mean
            self.multipliers[term] = max(0.0, mu + self.lr * violation)
            batch.stats[f"lagrange/{term}/multiplier"] = mu
            batch.stats[f"lagrange/{term}/violation"] = violation
        return batch

    def state_dict(self) -> dict:
        return {"multipliers": dict(self.multipliers)}

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.multipliers.update({k: float(v) for k, v in state["multipliers"].items()})
