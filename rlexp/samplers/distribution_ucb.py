"""DUMP's distribution-level curriculum ("DUMP: Automated Distribution-Level Curriculum Learning for RL-based LLM
Post-training", Wang et al., 2025, arXiv 2504.09710).

The training data is a mixture of distributions (reasoning-gym tasks, difficulty levels: ``key``). A distribution's
learnability is the expected absolute advantage of its recent samples — near 0 both where the policy always
succeeds and where it always fails — and the scheduler treats distributions as bandit arms:

    UCB_j = L̂_j + c·sqrt(2·ln N / n_j),   P(j) = softmax(UCB_j / τ)

with L̂_j the mean |A| over the last ``window`` groups drawn from j, n_j the prompts drawn from j so far and N their
sum. A distribution never drawn has an infinite score: those are tried first (uniformly). Each prompt of a batch
picks its distribution from P, then takes the next record of that distribution's own seeded shuffle (every record
once per epoch of its distribution). Logged each step: ``dump/prob/<j>``, ``dump/learnability/<j>``,
``sampler/drawn/<j>`` (the batch's count from j), beside the difficulty history every sampler logs."""

from __future__ import annotations

import math
import random
from collections import deque

from rlexp.core.registry import SAMPLERS
from rlexp.data.distributions import distribution_of
from rlexp.samplers.shuffle import PromptSampler


@SAMPLERS.register
class DistributionUCB(PromptSampler):
    """Prompts drawn distribution by distribution, by UCB over each distribution's mean |advantage| (DUMP)."""

    def __init__(
        self,
        records: list[dict],
        batch_size: int,
        seed: int,
        difficulty_window: int = 8,
        key: str | list[str] = "source_dataset",
        window: int = 40,
        temperature: float = 0.1,
        exploration: float = 1.0,
    ):
        super().__init__(records, batch_size, seed, difficulty_window)
        from rlexp.config.schema import ConfigError

        if temperature <= 0:
            raise ConfigError(f"sampler.temperature={temperature} must be > 0")
        if window < 1:
            raise ConfigError(f"sampler.window={window} must be ≥ 1")
        parts: dict[str, list[dict]] = {}
        for r in records:
            parts.setdefault(distribution_of(r, key), []).append(r)
        if len(parts) < 2:
            raise ConfigError(
                f"sampler=dump schedules a mixture, but sampler.key={key!r} puts every training record in one "
                f"distribution ({next(iter(parts))!r}); use a mixture (dataset=reasoning_gym dataset.tasks=...) or "
                "another key (difficulty, [source_dataset, difficulty])"
            )
        self.key, self.temperature, self.exploration = key, temperature, exploration
        self.names = sorted(parts)
        self.parts = {name: PromptSampler(parts[name], 1, seed * 1_000_003 + i) for i, name in enumerate(self.names)}
        self.window = window
        self.abs_advantages = {name: deque(maxlen=window) for name in self.names}
        self.drawn = {name: 0 for name in self.names}
        self.batches = 0
        self.last_counts: dict[str, int] = {}

    # ---- the bandit --------------------------------------------------------------------------------
    def learnability(self, name: str) -> float:
        seen = self.abs_advantages[name]
        return sum(seen) / len(seen) if seen else 0.0

    def scores(self) -> dict[str, float]:
        total = sum(self.drawn.values())
        out = {}
        for name in self.names:
            n = self.drawn[name]
            if n == 0:
                out[name] = math.inf
            else:
                bonus = math.sqrt(2.0 * math.log(max(total, 1)) / n)
                out[name] = self.learnability(name) + self.exploration * bonus
        return out

    def probabilities(self) -> dict[str, float]:
        scores = self.scores()
        unseen = [n for n, s in scores.items() if s == math.inf]
        if unseen:
            return {n: (1.0 / len(unseen) if n in unseen else 0.0) for n in self.names}
        top = max(scores.values())
        weights = {n: math.exp((s - top) / self.temperature) for n, s in scores.items()}
        z = sum(weights.values())
        return {n: w / z for n, w in weights.items()}

    # ---- drawing -------------------------------------------------------------------------------------
    def next_batch(self) -> list[dict]:
        self._check_size(self.batch_size)
        rng = random.Random(self.seed * 7_919 + self.batches)  # per batch: a resume draws the same
        self.batches += 1
        out, keys, counts = [], set(), {}
        for _ in range(self.batch_size):
            probs = self.probabilities()
            name = rng.choices(self.names, weights=[probs[n] for n in self.names])[0]
            record = self._draw_from(name, keys)
            out.append(record)
            keys.add(id(record))
            counts[name] = counts.get(name, 0) + 1
            self.drawn[name] += 1  # the exploration bonus counts it at once: a batch spreads over unseen arms
        self.consumed += len(out)
        self.last_counts = counts
        return out

    def _draw_from(self, name: str, taken: set[int]) -> dict:
        """The next record of ``name``'s shuffle not already in the batch (another distribution's when this one has
        too few records left for the batch)."""
        part = self.parts[name]
        for _ in range(len(part.records)):
            record = part.next_batch()[0]
            if id(record) not in taken:
                return record
        for other in self.names:  # every record of ``name`` is in the batch already
            if other != name and any(id(r) not in taken for r in self.parts[other].records):
                return self._draw_from(other, taken)
        raise RuntimeError("no record left to draw")  # unreachable: _check_size bounds the batch by the split

    # ---- feedback ------------------------------------------------------------------------------------
    def observe_advantages(self, records: list[dict], mean_abs: list[float]) -> None:
        """Each group's mean |advantage| joins its distribution's window."""
        for record, value in zip(records, mean_abs):
            name = distribution_of(record, self.key)
            if name in self.abs_advantages and math.isfinite(value):
                self.abs_advantages[name].append(float(value))

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        probs = self.probabilities()
        for name in self.names:
            out[f"dump/prob/{name}"] = probs[name]
            out[f"dump/learnability/{name}"] = self.learnability(name)
            out[f"sampler/drawn/{name}"] = float(self.last_counts.get(name, 0))
        return out

    # ---- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "parts": {n: p.state_dict() for n, p in self.parts.items()},
            "abs_advantages": {n: list(v) for n, v in self.abs_advantages.items()},
            "drawn": dict(self.drawn),
            "batches": self.batches,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for name, part in self.parts.items():
            if name in state.get("parts", {}):
                part.load_state_dict(state["parts"][name])
        for name, values in state.get("abs_advantages", {}).items():
            if name in self.abs_advantages:
                self.abs_advantages[name] = deque(values, maxlen=self.window)
        self.drawn.update({n: int(v) for n, v in state.get("drawn", {}).items() if n in self.drawn})
        self.batches = int(state.get("batches", 0))
