"""SFPO's update around the optimiser steps of one rollout ("Slow-Fast Policy Optimization: Reposition-Before-
Update for LLM Reasoning", 2025; arXiv 2510.04072), driven by ``algorithm.slow_fast``.

From the released code (Urheen/SFPO, Demo/fsdp_workers.py ``sfpo_update_actor``, Code/SFPO/verl/trainer/ppo/
ray_trainer.py): keep the slow weights θ_0; run the whole actor update (every mini-batch step) K times on the
same batch, the old log-probs fixed at θ_0 (the fast trajectory θ_1..θ_K); set θ ← θ_0 + α·(θ_K − θ_0) (the
reposition); run the update once more from there (the slow correction). The optimiser state carries on
through all of it. Once the z-score of a step's entropy against the last w steps reaches a threshold, the run
switches SFPO off for good (``zscore_w`` 30, ``zscore_threshold`` 1.0 in the released scripts).
"""

from __future__ import annotations

import math

import torch


@torch.no_grad()
def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    """Copies of the trainable parameters (the slow weights θ_0)."""
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def squared_distance(p: torch.Tensor, s: torch.Tensor) -> float:
    """‖p − s‖²; for an FSDP-sharded parameter (a DTensor) over every process's shard (a collective)."""
    sq = (p.detach().float() - s.float()).pow(2).sum()
    return float(sq.full_tensor() if hasattr(sq, "full_tensor") else sq)


@torch.no_grad()
def reposition(model: torch.nn.Module, slow: list[torch.Tensor], alpha: float) -> float:
    """θ ← θ_0 + α·(θ − θ_0) for every trainable parameter; returns ‖θ − θ_0‖ before the move (the length of
    the fast trajectory's displacement)."""
    sq = 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    if len(params) != len(slow):
        raise ValueError("reposition: the slow weights do not match the model's trainable parameters")
    for p, s in zip(params, slow):
        sq += squared_distance(p, s)
        p.lerp_(s.to(p.dtype), 1.0 - alpha)  # p + (1 − α)(s − p) = s + α(p − s)
    return math.sqrt(sq)


class SlowFastSchedule:
    """Whether SFPO still acts: off for good once the z-score of the newest step's entropy against the last
    ``stop_window`` steps' (population std + 1e-9, as the released code) reaches ``stop_threshold``. The entropy
    history is rebuilt from the logged steps on resume (``replay``), so no checkpoint field is needed."""

    def __init__(self, settings):
        self.s = settings
        self.entropy: list[float] = []
        self.stopped = False
        self.stopped_at: int | None = None

    @property
    def active(self) -> bool:
        return self.s.fast_steps > 0 and not self.stopped

    def observe(self, entropy: float, step: int) -> None:
        """Record step ``step``'s mean token entropy; decides for the steps after it."""
        if not math.isfinite(entropy):
            return
        self.entropy.append(float(entropy))
        w = self.s.stop_window
        if self.stopped or w <= 0 or len(self.entropy) < w:
            return
        last = self.entropy[-w:]
        mean = sum(last) / w
        std = math.sqrt(sum((e - mean) ** 2 for e in last) / w) + 1e-9
        if (self.entropy[-1] - mean) / std >= self.s.stop_threshold:
            self.stopped, self.stopped_at = True, step

    def replay(self, rows: list[dict], upto: int) -> None:
        """Rebuild the history from logged metric rows (``step``, ``entropy/mean``) of steps ≤ ``upto``."""
        for row in sorted((r for r in rows if 0 < r.get("step", 0) <= upto), key=lambda r: r["step"]):
            if "entropy/mean" in row:
                self.observe(float(row["entropy/mean"]), int(row["step"]))
