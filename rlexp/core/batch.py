"""The batch that flows through one training step (see DESIGN.md, "The data flow").

One row per completion. The rollout fills the token fields, the reward stage ``rewards``, group
stages may drop rows, reshape rewards or add rows replayed from earlier steps (RePO, ReMix: marked
``extras["replayed"]``, their ``sampling_logprobs`` the behaviour policy's), the advantage estimator
fills ``advantages``; no stage re-derives a field another stage owns. ``extras`` carries per-row
values added by later stages (e.g. GRPO-CARE confidences) and ``stats`` per-step scalars for the trackers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class RolloutBatch:
    prompt_ids: torch.Tensor  # (N, P) left-padded prompt tokens
    prompt_mask: torch.Tensor  # (N, P)
    completion_ids: torch.Tensor  # (N, T) right-padded completion tokens
    completion_mask: torch.Tensor  # (N, T) 1 for tokens up to and including EOS
    sampling_logprobs: torch.Tensor  # (N, T) log-probs under the sampling policy (temperature-scaled)
    truncated: torch.Tensor  # (N,) bool: no EOS within max_new_tokens
    group_ids: torch.Tensor  # (N,) prompt/group index; rows of a group are contiguous
    prompts: list[str]  # chat-templated prompt text per row
    completions: list[str]  # decoded completion text per row
    records: list[dict]  # the dataset record (question, answer, metadata, scorer) per row
    rewards: torch.Tensor | None = None  # (N, R) raw score per reward term
    reward_names: list[str] = field(default_factory=list)
    reward_weights: torch.Tensor | None = None  # (R,)
    reward: torch.Tensor | None = None  # (N,) weighted total after group stages
    reward_failures: torch.Tensor | None = None  # (N, R) bool: the term raised on this row
    advantages: torch.Tensor | None = None  # (N,) or (N, T)
    old_logprobs: torch.Tensor | None = None  # (N, T) policy log-probs before the update (μ > 1)
    ref_logprobs: torch.Tensor | None = None  # (N, T) reference log-probs (KL)
    values: torch.Tensor | None = None  # (N, T) critic values (PPO)
    extras: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @classmethod
    def from_generation(cls, out, group_ids: torch.Tensor, prompts: list[str], records: list[dict]) -> RolloutBatch:
        """The unscored batch of a rollout's output (``rlexp.rollout``'s generation: token ids, masks, sampling
        log-probs, texts), one row per completion, with each row's group id, prompt text and record."""
        return cls(
            prompt_ids=out.prompt_ids,
            prompt_mask=out.prompt_mask,
            completion_ids=out.completion_ids,
            completion_mask=out.completion_mask,
            sampling_logprobs=out.logprobs,
            truncated=out.truncated.to(group_ids.device),
            group_ids=group_ids,
            prompts=prompts,
            completions=out.texts,
            records=records,
        )

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(-1)

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.unique().numel())

    def term(self, name: str) -> torch.Tensor:
        """Raw (unweighted) scores of one reward term."""
        if name not in self.reward_names:
            raise KeyError(f"reward term {name!r} not in {self.reward_names}")
        return self.rewards[:, self.reward_names.index(name)]

    def select(self, index: torch.Tensor | list[int]) -> RolloutBatch:
        """Rows ``index`` (in that order); tensors, lists and per-row extras are all sliced."""
        idx = torch.as_tensor(index, dtype=torch.long)
        n = len(self)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = _take(v, idx, n) if f.name not in ("reward_names", "reward_weights", "stats") else v
        out["extras"] = {k: _take(v, idx, n) for k, v in self.extras.items()}
        out["stats"] = dict(self.stats)
        return RolloutBatch(**out)

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Row-wise concatenation (used when dynamic sampling refills a batch). Token tensors are
        re-padded to the widest batch; group ids must already be distinct across parts."""
        first = batches[0]
        out = {}
        for f in fields(first):
            vals = [getattr(b, f.name) for b in batches]
            if f.name in ("reward_names", "reward_weights"):
                out[f.name] = vals[0]
            elif f.name == "stats":
                out[f.name] = dict(first.stats)
            elif f.name == "extras":
                out[f.name] = {k: _cat([b.extras[k] for b in batches], k) for k in first.extras}
            else:
                out[f.name] = _cat(vals, f.name)
        return RolloutBatch(**out)


def _take(v, idx, n):
    if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n:
        return v[idx.to(v.device)]
    if isinstance(v, list) and len(v) == n:
        return [v[i] for i in idx.tolist()]
    return v


_LEFT_PADDED = {"prompt_ids", "prompt_mask"}


def _cat(vals, name):
    if vals[0] is None:
        return None
    if isinstance(vals[0], list):
        return [x for v in vals for x in v]
    if vals[0].dim() == 2:
        width = max(v.shape[1] for v in vals)
        padded = []
        for v in vals:
            pad = width - v.shape[1]
            if pad:
                z = torch.zeros(v.shape[0], pad, dtype=v.dtype, device=v.device)
                v = torch.cat([z, v], 1) if name in _LEFT_PADDED else torch.cat([v, z], 1)
            padded.append(v)
        return torch.cat(padded)
    return torch.cat(vals)
