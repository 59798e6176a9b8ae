"""Weakness-driven problem synthesis, after SwS ("SwS: Self-aware Weakness-driven Problem Synthesis in Reinforcement
Learning for LLM Reasoning", 2025, arXiv 2506.08989): the problems the policy keeps failing mark its weaknesses, and
new training problems are made where they are.

SwS has an LLM extract the concepts of the failed problems and write new problems from them. Offline, the dataset's
own generator stands in: every ``every`` steps, the prompts that turned weak since the last round (pass rate
≤ ``threshold`` over at least ``min_visits`` visits, from the difficulty history every sampler keeps) are counted per
distribution (``key``: the reasoning-gym task), and ``per_round`` fresh problems are generated from those tasks in
proportion (``rlexp.data.synthesis``: same task, same options, a new seed; questions already in the training split
are dropped). Synthesised problems wait in a pool; each batch takes up to ``share`` of its prompts from it (each
used once), the rest from the seeded shuffle. Logged: ``sws/weak_prompts``, ``sws/synthesised``, ``sws/pool``,
``sws/drawn``."""

from __future__ import annotations

from collections import Counter

from rlexp.core.registry import SAMPLERS
from rlexp.data.distributions import distribution_of
from rlexp.samplers.feedback import GroupFeedback, record_key
from rlexp.samplers.shuffle import PromptSampler


def proportional(counts: dict[str, int], total: int) -> dict[str, int]:
    """``total`` split over the keys in proportion to ``counts`` (largest remainders; ties by key)."""
    weight = sum(counts.values())
    if weight == 0 or total <= 0:
        return {}
    exact = {k: total * c / weight for k, c in counts.items()}
    out = {k: int(v) for k, v in exact.items()}
    rest = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:rest]:
        out[k] += 1
    return {k: v for k, v in out.items() if v > 0}


@SAMPLERS.register
class WeaknessSynthesis(PromptSampler):
    """The seeded shuffle, plus problems generated where the policy fails (SwS, offline)."""

    def __init__(
        self,
        records: list[dict],
        batch_size: int,
        seed: int,
        difficulty_window: int = 8,
        dataset=None,
        key: str | list[str] = "source_dataset",
        every: int = 2,
        threshold: float = 0.0,
        min_visits: int = 1,
        per_round: int = 16,
        share: float = 0.25,
    ):
        super().__init__(records, batch_size, seed, difficulty_window)
        from rlexp.config.schema import ConfigError
        from rlexp.data.synthesis import generator_tasks

        for name, value, ok in (
            ("every", every, every >= 1),
            ("per_round", per_round, per_round >= 1),
            ("min_visits", min_visits, 1 <= min_visits <= difficulty_window),
            ("share", share, 0.0 < share <= 1.0),
            ("threshold", threshold, 0.0 <= threshold < 1.0),
        ):
            if not ok:
                raise ConfigError(f"sampler.{name}={value} is out of range (see conf/sampler/sws.yaml)")
        self.generators = generator_tasks(dataset)
        self.key, self.every, self.threshold, self.min_visits = key, every, threshold, min_visits
        self.per_round, self.share = per_round, share
        self.known = {r["question"] for r in records}
        self.by_key = {record_key(r): r for r in records}
        self.pool: list[dict] = []
        self.weak_seen: set[str] = set()  # prompts already counted as weak in an earlier round
        self.pending: Counter = Counter()  # weak prompts per distribution since the last round
        self.observed, self.rounds, self.synthesised, self.drawn = 0, 0, 0, 0

    # ---- weakness --------------------------------------------------------------------------------
    def observe(self, feedback: GroupFeedback) -> None:
        super().observe(feedback)
        for record in feedback.records:
            k = record_key(record)
            seen = self.difficulty.history.get(k)
            if k in self.weak_seen or not seen or len(seen) < self.min_visits:
                continue
            if sum(seen) / len(seen) <= self.threshold:
                self.weak_seen.add(k)
                self.pending[distribution_of(record, self.key)] += 1
        self.observed += 1
        if self.observed % self.every == 0:
            self.synthesise()

    def synthesise(self) -> None:
        """One round: ``per_round`` new problems over the weak distributions that have a generator."""
        counts = {d: c for d, c in self.pending.items() if d in self.generators}
        self.pending.clear()
        for task, n in sorted(proportional(counts, self.per_round).items()):
            from rlexp.data.synthesis import generate

            seed = (self.seed * 1_000_003 + self.rounds * 7_919 + sum(map(ord, task))) % (2**31)
            fresh = generate(task, self.generators[task], n, seed, f"sws{self.rounds}-{task}")
            fresh = [r for r in fresh if r["question"] not in self.known]
            for r in fresh:
                r["metadata"] = {**r["metadata"], "synthesised_round": self.rounds}
                self.known.add(r["question"])
            self.pool.extend(fresh)
            self.synthesised += len(fresh)
        self.rounds += 1

    # ---- drawing ---------------------------------------------------------------------------------
    def next_batch(self) -> list[dict]:
        take = min(int(self.share * self.batch_size + 0.5), len(self.pool))
        saved = self.batch_size
        self.batch_size = saved - take
        try:
            rest = super().next_batch() if self.batch_size > 0 else []
        finally:
            self.batch_size = saved
        new, self.pool = self.pool[:take], self.pool[take:]
        self.drawn = len(new)
        return new + rest

    def metrics(self) -> dict[str, float]:
        return {
            **super().metrics(),
            "sws/weak_prompts": float(len(self.weak_seen)),
            "sws/synthesised": float(self.synthesised),
            "sws/pool": float(len(self.pool)),
            "sws/drawn": float(self.drawn),
        }

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "pool": list(self.pool),
            "weak_seen": sorted(self.weak_seen),
            "pending": dict(self.pending),
            "observed": self.observed,
            "rounds": self.rounds,
            "synthesised": self.synthesised,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.pool = list(state.get("pool", []))
        self.weak_seen = set(state.get("weak_seen", []))
        self.pending = Counter(state.get("pending", {}))
        self.observed = int(state.get("observed", 0))
        self.rounds = int(state.get("rounds", 0))
        self.synthesised = int(state.get("synthesised", 0))
        self.known |= {r["question"] for r in self.pool}
