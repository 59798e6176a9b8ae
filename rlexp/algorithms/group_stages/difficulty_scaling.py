"""Difficulty-scaled rewards — GRPO-S ("GRPO with Scaling") of DR-IRL ("Inverse Reinforcement Learning with Dynamic
Reward Scaling for LLM Alignment", Cheng et al., 2025; arXiv 2503.18991): the reward of a prompt is scaled by its task
difficulty, measured at the data level (the paper: CLIP / text-encoder cosine similarity) and at the model level (the
paper: reward gaps, how strongly the policy's reward responds on the prompt).

The paper's scaling formula was not in what we could read; ours, per group g (one prompt's G completions):

    h_data(g)  = failure rate of the prompt on ``hardness_term``: 1 − mean r over the group (``hardness: group``), or
                 the prompt's running mean of that rate over every step it was drawn in (``hardness: running``, kept in
                 checkpoints) — an offline proxy for the paper's encoder similarity, which needs an embedding model;
    h_model(g) = 1 − (max_g r − min_g r) / (max r − min r over the batch): a group whose rewards barely spread is one
                 the policy does not respond to (0 when the batch's rewards do not spread at all);
    s(g)       = 1 + α·h_data(g) + β·h_model(g),       r_i ← s(g)·r_i   (the total reward; term columns stay raw).

A per-group factor cancels in GRPO's group-std normalisation, so conf/algorithm/grpo_scaling.yaml centres by the group
mean and divides by the batch std (Lite PPO's scale), where the factor survives: a hard prompt's advantages weigh up
to 1 + α + β times an easy one's.
"""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_stats

HARDNESS = ("group", "running")


def _group_extremes(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (max, min) of ``values`` over each row's group."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    v = values.float()
    hi = torch.full((k,), float("-inf"), device=v.device).scatter_reduce(0, inv, v, "amax")
    lo = torch.full((k,), float("inf"), device=v.device).scatter_reduce(0, inv, v, "amin")
    return hi[inv], lo[inv]


def _prompt_key(record: dict, prompt: str) -> str:
    rid = record.get("id") if isinstance(record, dict) else None
    return str(rid) if rid is not None else str(record.get("question", prompt) if isinstance(record, dict) else prompt)


@GROUP_STAGES.register
class DifficultyScaling:
    """Group stage: GRPO-S's difficulty-scaled reward (see the module doc). ``hardness_term``: the reward term in
    [0, 1] whose failure rate is the data-level hardness; ``hardness``: group | running; ``alpha``, ``beta``: the
    weights of the data- and model-level difficulty. Metrics: ``grpo_scaling/scale_mean``,
    ``grpo_scaling/scale_max``, ``grpo_scaling/hardness_mean``, ``grpo_scaling/unresponsive_mean`` (h_model)."""

    needs_reference = False

    def __init__(self, hardness_term: str = "accuracy", alpha: float = 0.5, beta: float = 0.5, hardness: str = "group"):
        where = "algorithm.group_stages: DifficultyScaling"
        if alpha < 0 or beta < 0:
            raise ValueError(f"{where}: alpha={alpha} and beta={beta} must be >= 0")
        if hardness not in HARDNESS:
            raise ValueError(f"{where}.hardness={hardness!r} is not one of {list(HARDNESS)}")
        self.term, self.alpha, self.beta, self.hardness = str(hardness_term), float(alpha), float(beta), hardness
        self.history: dict[str, list[float]] = {}  # running: prompt -> [sum of failure rates, visits]

    def data_hardness(self, batch: RolloutBatch) -> torch.Tensor:
        if self.term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: DifficultyScaling.hardness_term={self.term!r} is not a reward term "
                f"(terms: {batch.reward_names})"
            )
        mean, _, _ = group_stats(batch.term(self.term).float().clamp(0.0, 1.0), batch.group_ids)
        fail = 1.0 - mean
        if self.hardness == "group":
            return fail
        out = fail.clone()
        seen: dict[int, float] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            if g not in seen:
                key = _prompt_key(batch.records[i], batch.prompts[i])
                total, n = self.history.get(key, [0.0, 0])
                total, n = total + float(fail[i]), n + 1
                self.history[key] = [total, n]
                seen[g] = total / n
            out[i] = seen[g]
        return out

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        h_data = self.data_hardness(batch).to(batch.reward.device)
        r = batch.reward.float()
        hi, lo = _group_extremes(r, batch.group_ids.to(r.device))
        span = float(r.max() - r.min()) if r.numel() else 0.0
        h_model = (1.0 - (hi - lo) / span).clamp(0.0, 1.0) if span > 0 else torch.zeros_like(r)
        scale = 1.0 + self.alpha * h_data + self.beta * h_model
        batch.reward = (scale * r).to(batch.reward.dtype)
        batch.stats["grpo_scaling/scale_mean"] = float(scale.mean())
        batch.stats["grpo_scaling/scale_max"] = float(scale.max())
        batch.stats["grpo_scaling/hardness_mean"] = float(h_data.mean())
        batch.stats["grpo_scaling/unresponsive_mean"] = float(h_model.mean())
        return batch

    def state_dict(self) -> dict:
        return {"history": {k: list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.history = {k: [float(v[0]), int(v[1])] for k, v in state.get("history", {}).items()}
