"""Deterministic prompt order with a resumable position."""

from __future__ import annotations

import random

from rlexp.core.registry import SAMPLERS


@SAMPLERS.register
class PromptSampler:
    """Yields batches of records in a seeded order reshuffled every epoch. ``state_dict`` is the
    number of prompts consumed, from which the order is recomputed on resume."""

    def __init__(self, records: list[dict], batch_size: int, seed: int):
        if not records:
            raise ValueError("the training split is empty")
        self.records, self.batch_size, self.seed = records, batch_size, seed
        self.consumed = 0
        self._epoch, self._order = -1, []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.records)))
            random.Random(self.seed * 100_003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order

    def next_batch(self) -> list[dict]:
        out = []
        for _ in range(self.batch_size):
            epoch, pos = divmod(self.consumed, len(self.records))
            out.append(self.records[self._order_for(epoch)[pos]])
            self.consumed += 1
        return out

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
