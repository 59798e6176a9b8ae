"""The reward stage: every term scores every sample; the weighted sum is the reward."""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.rewards.terms import RewardTerm, Sample


def samples_of(batch: RolloutBatch) -> list[Sample]:
    lengths = batch.lengths.tolist()
    ids = batch.completion_ids.tolist()
    return [
        Sample(
            batch.prompts[i],
            batch.completions[i],
            batch.records[i],
            int(batch.group_ids[i]),
            int(lengths[i]),
            bool(batch.truncated[i]),
            ids[i][: int(lengths[i])],
        )
        for i in range(len(batch))
    ]


def score(batch: RolloutBatch, terms: dict[str, RewardTerm]) -> RolloutBatch:
    if not terms:
        raise ValueError("reward.terms is empty: configure at least one reward term")
    samples = samples_of(batch)
    cols, fails = [], []
    for name, term in terms.items():
        res = term(samples)
        if len(res.scores) != len(samples):
            raise ValueError(f"reward term {name!r} returned {len(res.scores)} scores for {len(samples)} samples")
        cols.append(res.scores)
        fails.append(res.failures or [False] * len(samples))
    device = batch.completion_ids.device
    batch.rewards = torch.tensor(cols, dtype=torch.float32, device=device).T.contiguous()
    batch.reward_failures = torch.tensor(fails, dtype=torch.bool, device=device).T.contiguous()
    batch.reward_names = list(terms)
    batch.reward_weights = torch.tensor([t.weight for t in terms.values()], dtype=torch.float32, device=device)
    batch.reward = batch.rewards @ batch.reward_weights
    return batch
