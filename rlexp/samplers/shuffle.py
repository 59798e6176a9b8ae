"""Deterministic prompt order with a resumable position."""

from __future__ import annotations

import random

from rlexp.core.registry import SAMPLERS
from rlexp.samplers.difficulty import PassRateHistory
from rlexp.samplers.feedback import GroupFeedback


@SAMPLERS.register
class PromptSampler:
    """Yields batches of records in a seeded order reshuffled every epoch; every record once per epoch and never
    twice in one batch. ``state_dict`` is the number of prompts consumed, from which the order is recomputed on
    resume, and the batch that crossed into the current epoch.

    A batch that straddles two epochs takes the last records of the one and the first of the next; the records
    it took from the old epoch are moved, in the new epoch's order, to just after the records the batch takes
    from it, so the batch holds each record once (and the new epoch still holds every record once). A batch
    larger than the training split would have to repeat records: refused (``ConfigError`` naming
    ``trainer.prompts_per_step`` and the split's size).

    Every sampler tracks each prompt's pass rate (``difficulty``, fed by ``observe`` with the step's
    ``GroupFeedback``) and reports it with its own choices in ``metrics``, logged each step under ``sampler/``."""

    def __init__(self, records: list[dict], batch_size: int, seed: int, difficulty_window: int = 8):
        if not records:
            raise ValueError("the training split is empty")
        self.records, self.batch_size, self.seed = records, batch_size, seed
        self._configured = batch_size
        self._check_size(batch_size)
        self.consumed = 0
        self._epoch, self._order = -1, []
        # the straddling batch that entered the current epoch: its records from the old epoch and how many it
        # takes from the new one (the order of epoch ``_carry_epoch`` keeps the former out of the latter)
        self._carry: list[int] = []
        self._carry_head, self._carry_epoch = 0, -1
        self.difficulty = PassRateHistory(difficulty_window)

    def _check_size(self, n: int) -> None:
        if n > len(self.records):
            from rlexp.config.schema import ConfigError

            what = f"trainer.prompts_per_step={n}" if n == self._configured else f"a batch of {n} prompts"
            raise ConfigError(
                f"{what} is more than the {len(self.records)} prompts of the training split, so a step would hold "
                "some twice; lower trainer.prompts_per_step or use more data (dataset.train_size, a larger file)"
            )

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self.records)))
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
            if epoch == self._carry_epoch and self._carry:
                carry = set(self._carry)
                rest = [i for i in order if i not in carry]
                head = self._carry_head
                order = rest[:head] + [i for i in order if i in carry] + rest[head:]
            self._order, self._epoch = order, epoch
        return self._order

    def next_batch(self) -> list[dict]:
        self._check_size(self.batch_size)
        n = len(self.records)
        out: list[int] = []
        for _ in range(self.batch_size):
            epoch, pos = divmod(self.consumed, n)
            if pos == 0 and out and epoch != self._carry_epoch:  # this batch enters a new epoch
                self._carry, self._carry_head, self._carry_epoch = list(out), self.batch_size - len(out), epoch
            out.append(self._order_for(epoch)[pos])
            self.consumed += 1
        return [self.records[i] for i in out]

    def observe(self, feedback: GroupFeedback) -> None:
        """The step's groups, scored: their pass rates join the difficulty history."""
        self.difficulty.observe(feedback)

    def metrics(self) -> dict[str, float]:
        """What to log for the last step (``sampler/…``)."""
        return self.difficulty.metrics()

    def state_dict(self) -> dict:
        return {
            "consumed": self.consumed,
            "carry": list(self._carry),
            "carry_head": self._carry_head,
            "carry_epoch": self._carry_epoch,
            "difficulty": self.difficulty.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])
        self._carry = [int(i) for i in state.get("carry", [])]  # a checkpoint from before the carry: none
        self._carry_head = int(state.get("carry_head", 0))
        self._carry_epoch = int(state.get("carry_epoch", -1))
        self._epoch, self._order = -1, []
        self.difficulty.load_state_dict(state.get("difficulty"))  # a checkpoint from before it: an empty history
