"""EGPO's extragradient update ("Extragradient Preference Optimization (EGPO): Beyond Last-Iterate Convergence for Nash
Learning from Human Feedback", Zhou, Fazel and Du, 2025; arXiv 2503.08942), driven by ``algorithm.extragradient``.

From the released code (zhourunlong/EGPO, ``lms/trainers/extragradient_trainer.py``): every update of the policy takes
two training steps. On the first (odd) step the parameters and the optimiser state are backed up, pairs are sampled
from π_θt and an ordinary step goes to the look-ahead θ_{t+1/2}. On the second (even) step the pairs are sampled
from the look-ahead policy, the parameters and optimiser state are put back to the backup θ_t, and the gradient of
the loss on the look-ahead's samples, taken at θ_t, moves θ_t to θ_{t+1}. The learning-rate schedule runs on. Our
trainer samples every step from the current weights, so the schedule is one rollout and one update per step, with
the backup taken before odd steps' updates and restored before even steps' updates.

The backup is part of the checkpoint (a stateful part), so a run stopped after a look-ahead step resumes with it.
Metrics: ``egpo/lookahead`` (1 on look-ahead steps) and ``egpo/lookahead_distance`` (‖θ_{t+1/2} − θ_t‖, on the
restoring steps).
"""

from __future__ import annotations

import copy
import math

import torch

from rlexp.trainer.slow_fast import snapshot, squared_distance


class Extragradient:
    """The backup and restore around each training step's update (module doc)."""

    def __init__(self):
        self.saved: dict | None = None

    def before_update(self, step: int, model: torch.nn.Module, optimizer) -> dict[str, float]:
        if step % 2 == 1:
            self.saved = {"params": snapshot(model), "optimizer": copy.deepcopy(optimizer.state_dict())}
            return {"egpo/lookahead": 1.0}
        if self.saved is None:
            raise RuntimeError(f"extragradient: step {step} restores a backup that the look-ahead step did not take")
        distance = restore(model, self.saved["params"])
        optimizer.load_state_dict(self.saved["optimizer"])
        self.saved = None
        return {"egpo/lookahead": 0.0, "egpo/lookahead_distance": distance}

    def state_dict(self) -> dict | None:
        return self.saved

    def load_state_dict(self, state: dict | None) -> None:
        self.saved = state


@torch.no_grad()
def restore(model: torch.nn.Module, saved: list[torch.Tensor]) -> float:
    """θ ← the backup; returns ‖θ − backup‖ before the move."""
    params = [p for p in model.parameters() if p.requires_grad]
    if len(params) != len(saved):
        raise ValueError("extragradient: the backup does not match the model's trainable parameters")
    sq = 0.0
    for p, s in zip(params, saved):
        sq += squared_distance(p, s)
        p.copy_(s.to(device=p.device, dtype=p.dtype))
    return math.sqrt(sq)
