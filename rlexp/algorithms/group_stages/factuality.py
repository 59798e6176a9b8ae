"""KLCF's Dual-Fact Alignment in the step's log ("Knowledge-Level Consistency Reinforcement Learning: Dual-Fact
Alignment for Long-Form Factuality", 2025; arXiv 2509.23765).

The two rewards themselves are reward terms (``rlexp.rewards.factuality``: checklist recall, self-assessed
precision; ``reward=klcf``). ``DualFactLog`` makes ``algorithm=klcf`` refuse a run without them (the method trains on
both, never on the ground-truth accuracy by mistake) and logs how they combine per completion:
``klcf/f1_mean`` (mean over rows of the harmonic mean 2·R·P / (R + P), 0 where both are 0), and the share of
completions that cover no checklist fact (``klcf/zero_recall_frac``) or that the base model doubts on average
(``klcf/low_precision_frac``: precision < 0.5). It changes no reward."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES


@GROUP_STAGES.register
class DualFactLog:
    """Group stage: requires the recall and precision reward terms and logs their per-row combination (see the
    module docstring)."""

    needs_reference = False

    def __init__(self, recall_term: str = "checklist_recall", precision_term: str = "self_precision"):
        self.recall_term, self.precision_term = recall_term, precision_term

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        for key, name in (("recall_term", self.recall_term), ("precision_term", self.precision_term)):
            if name not in batch.reward_names:
                raise KeyError(
                    f"algorithm.group_stages: DualFactLog.{key}={name!r} is not a reward term (terms: "
                    f"{batch.reward_names}): KLCF trains on checklist recall and self-assessed precision, "
                    "reward=klcf"
                )
        r, p = batch.term(self.recall_term).float(), batch.term(self.precision_term).float()
        f1 = torch.where(r + p > 0, 2 * r * p / (r + p).clamp(min=1e-12), torch.zeros_like(r))
        s = batch.stats
        s["klcf/f1_mean"] = float(f1.mean()) if len(f1) else 0.0
        s["klcf/zero_recall_frac"] = float((r <= 0).float().mean()) if len(r) else 0.0
        s["klcf/low_precision_frac"] = float((p < 0.5).float().mean()) if len(p) else 0.0
        return batch
