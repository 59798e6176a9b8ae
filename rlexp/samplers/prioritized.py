"""SPO's prioritised prompt sampling ("Single-stream Policy Optimization", Xu & Ding, 2025, arXiv 2509.13232): each
prompt's success probability is tracked by a discounted Beta estimate p̂ = α/(α+β) (α ← ρα + rate, β ← ρβ + 1 −
rate, with the step's pass rate of the prompt), and a step draws ``batch_size`` distinct prompts with probability
∝ sqrt(p̂(1 − p̂)) + ε (ε = 0.05, the released code's exploration floor): prompts near p̂ = 1/2 first, solved and
hopeless ones rarely. A sampler sees no policy, so its ρ is constant (the release's ``rho.type=constant``; the
algorithm's own tracker, ``SingleStreamValues``, uses the KL-adaptive ρ for the baseline).

Logged: ``spo_sampler/weight_mean`` and ``spo_sampler/drawn_value_mean`` (mean p̂ of the last drawn batch)."""

from __future__ import annotations

import math
import random

from rlexp.core.registry import SAMPLERS
from rlexp.samplers.feedback import GroupFeedback, record_key
from rlexp.samplers.shuffle import PromptSampler


def kl_rho(d: float, d_half: float, rho_min: float, rho_max: float) -> float:
    """SPO's forgetting factor: 2^(−D/D_half) clipped to [ρ_min, ρ_max]."""
    return min(rho_max, max(rho_min, 2.0 ** (-d / d_half)))


def priority_weight(p: float, eps: float = 0.05) -> float:
    """SPO's sampling weight of a prompt with success estimate p: sqrt(p(1 − p)) + ε."""
    return math.sqrt(max(p * (1.0 - p), 0.0)) + eps


class BetaTracker:
    """α, β per prompt key (first sight: α0, β0); ``value`` = α/(α+β); ``update`` discounts by ρ and adds r."""

    def __init__(self, alpha0: float = 0.5, beta0: float = 0.5):
        if alpha0 <= 0 or beta0 <= 0:
            raise ValueError(f"tracker alpha0={alpha0}, beta0={beta0} must be > 0")
        self.alpha0, self.beta0 = float(alpha0), float(beta0)
        self.alpha: dict[str, float] = {}
        self.beta: dict[str, float] = {}

    def value(self, key: str) -> float:
        a, b = self.alpha.get(key, self.alpha0), self.beta.get(key, self.beta0)
        return a / (a + b)

    def update(self, key: str, r: float, rho: float) -> None:
        r = min(1.0, max(0.0, float(r)))
        self.alpha[key] = rho * self.alpha.get(key, self.alpha0) + r
        self.beta[key] = rho * self.beta.get(key, self.beta0) + (1.0 - r)

    def state_dict(self) -> dict:
        return {"alpha": dict(self.alpha), "beta": dict(self.beta)}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.alpha = {k: float(v) for k, v in state.get("alpha", {}).items()}
            self.beta = {k: float(v) for k, v in state.get("beta", {}).items()}


def weighted_draw(weights: list[float], k: int, rng: random.Random) -> list[int]:
    """k distinct indices, each next one with probability ∝ its weight among those left (Efraimidis–Spirakis keys
    u^(1/w), the k largest)."""
    keys = [(rng.random() ** (1.0 / w), i) for i, w in enumerate(weights)]
    return [i for _, i in sorted(keys, reverse=True)[:k]]


@SAMPLERS.register
class ValuePrioritized(PromptSampler):
    """Prompts drawn by SPO's priority sqrt(p̂(1 − p̂)) + ε from a per-prompt discounted Beta tracker."""

    def __init__(
        self,
        records: list[dict],
        batch_size: int,
        seed: int,
        difficulty_window: int = 8,
        eps: float = 0.05,
        rho: float = 0.875,
        alpha0: float = 0.5,
        beta0: float = 0.5,
    ):
        super().__init__(records, batch_size, seed, difficulty_window)
        from rlexp.config.schema import ConfigError

        if eps <= 0:
            raise ConfigError(f"sampler.eps={eps} must be > 0 (every prompt keeps a chance)")
        if not 0.0 < rho <= 1.0:
            raise ConfigError(f"sampler.rho={rho} must be in (0, 1]")
        if alpha0 <= 0 or beta0 <= 0:
            raise ConfigError(f"sampler.alpha0={alpha0}, sampler.beta0={beta0} must be > 0")
        self.eps, self.rho = float(eps), float(rho)
        self.tracker = BetaTracker(alpha0, beta0)
        self.steps = 0
        self.last: dict[str, float] = {}

    def weights(self) -> list[float]:
        return [priority_weight(self.tracker.value(record_key(r)), self.eps) for r in self.records]

    def next_batch(self) -> list[dict]:
        self._check_size(self.batch_size)
        rng = random.Random(self.seed * 1_000_003 + self.steps)
        weights = self.weights()
        picked = weighted_draw(weights, self.batch_size, rng)
        self.steps += 1
        self.consumed += len(picked)
        out = [self.records[i] for i in picked]
        self.last = {
            "spo_sampler/weight_mean": sum(weights[i] for i in picked) / len(picked),
            "spo_sampler/drawn_value_mean": sum(self.tracker.value(record_key(r)) for r in out) / len(out),
        }
        return out

    def observe(self, feedback: GroupFeedback) -> None:
        super().observe(feedback)
        for record, rate in zip(feedback.records, feedback.pass_rate):
            if rate == rate:  # NaN: no accuracy term
                self.tracker.update(record_key(record), rate, self.rho)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), **self.last}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "steps": self.steps, "tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.steps = int(state.get("steps", 0))
        self.tracker.load_state_dict(state.get("tracker"))
