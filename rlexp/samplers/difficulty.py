"""Per-prompt difficulty: the history of each prompt's pass rate (the share of its group's completions the accuracy
term scored correct) over the steps that drew it. Every sampler keeps one (``PromptSampler.difficulty``); curricula
read it, and its summary is logged each step under ``sampler/``."""

from __future__ import annotations

import math
from collections import deque

from rlexp.samplers.feedback import GroupFeedback, record_key


class PassRateHistory:
    """The last ``window`` pass rates of every prompt seen (NaN rates, from runs without an accuracy term, are not
    kept). ``pass_rate(key)`` is their mean, None for a prompt never seen."""

    def __init__(self, window: int = 8):
        if window < 1:
            raise ValueError(f"sampler.difficulty_window={window} must be ≥ 1")
        self.window = window
        self.history: dict[str, deque[float]] = {}
        self._batch: dict[str, float] = {}

    def observe(self, feedback: GroupFeedback) -> None:
        """Add the step's pass rates (after noting how the step's prompts stood before it: ``metrics``)."""
        prior = [p for p in (self.pass_rate(record_key(r)) for r in feedback.records) if p is not None]
        self._batch = {"sampler/batch_new_prompts": float(len(feedback.records) - len(prior))}
        if prior:  # none seen before (the first epoch): no value rather than NaN in every tracker
            self._batch["sampler/batch_prior_pass_rate"] = sum(prior) / len(prior)
        for record, rate in zip(feedback.records, feedback.pass_rate):
            if not math.isnan(rate):
                self.history.setdefault(record_key(record), deque(maxlen=self.window)).append(float(rate))

    def pass_rate(self, key: str) -> float | None:
        seen = self.history.get(key)
        return sum(seen) / len(seen) if seen else None

    def metrics(self) -> dict[str, float]:
        """``sampler/tracked_prompts``; over the tracked prompts, their mean pass rate and the shares never solved
        (rate 0) and always solved (rate 1); over the last observed step's prompts, those new to the run and the
        mean pass rate the others had before it (absent when none was seen before)."""
        rates = [sum(h) / len(h) for h in self.history.values() if h]
        out = {"sampler/tracked_prompts": float(len(rates))}
        if rates:
            out["sampler/pass_rate_mean"] = sum(rates) / len(rates)
            out["sampler/unsolved_share"] = sum(r == 0.0 for r in rates) / len(rates)
            out["sampler/solved_share"] = sum(r == 1.0 for r in rates) / len(rates)
        out.update(self._batch)
        return out

    def state_dict(self) -> dict:
        return {"window": self.window, "history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict | None) -> None:
        self.history = {k: deque(v, maxlen=self.window) for k, v in (state or {}).get("history", {}).items()}
