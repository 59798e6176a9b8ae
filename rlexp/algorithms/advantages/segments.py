"""Advantages of episodes that span several rows: SUPO's summarised segments ("Scaling LLM Multi-turn RL with End-to-end
Summarization-based Context Management", Lu et al., 2025, arXiv 2510.06727).

SUPO's rollout (``rlexp.rollout.summarizing``) cuts a long episode into segments at each summary, one row each; the
episode's policy gradient is the sum of its segments'. The group-relative advantage is the episode's: GRPO over the
G episodes of a prompt — one reward each, the reward of its last segment's row (the outcome) — not over their rows,
so an episode is not counted once per summary it wrote (the de-duplication by rollout of the verl ports of SUPO);
every row of the episode gets it, on every policy token (summaries included). Rows of unfinished episodes stay in
the statistics; ``overlong_mask`` takes them out of the loss."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import SCALES, check_singleton, normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES


def episode_rows(batch: RolloutBatch) -> tuple[list[int], list[int]]:
    """(``rep``, ``index``): for each episode of the batch (in order of first row), the row standing for it — its
    last segment's, else its first present row — and for each row, its episode's position in ``rep``. An episode is
    its group and its ``record["episode"]["episode_index"]`` (rollout=supo)."""
    keys, final, order = [], {}, {}
    for i, (g, record) in enumerate(zip(batch.group_ids.tolist(), batch.records)):
        ep = record.get("episode") if isinstance(record, dict) else None
        if ep is None or "segment" not in ep or "episode_index" not in ep:
            raise ValueError(
                "algorithm.advantage (supo) reads SUPO's segment rows (record['episode'] with 'segment' and "
                "'episode_index'): run it with rollout=supo environment=tool_use tools=[python]"
            )
        key = (int(g), int(ep["episode_index"]))
        keys.append(key)
        order.setdefault(key, i)
        if ep["segment"] == ep["segments"] - 1:
            final[key] = i
    place = {key: j for j, key in enumerate(order)}
    return [final.get(key, first) for key, first in order.items()], [place[key] for key in keys]


@ADVANTAGES.register
def supo(batch: RolloutBatch, scale: str = "group", eps: float = 1e-6, singleton: str = "zero") -> torch.Tensor:
    """SUPO's advantage (module doc): ``normalize_rewards`` (``scale``, ``eps``, ``singleton`` as in GRPO's) over the
    episodes, one value per row. Stats: ``supo/episodes``, ``supo/rows_per_episode``, ``supo/adv_abs_mean`` (over
    episodes)."""
    if scale not in SCALES:
        raise ValueError(f"algorithm.advantage.scale={scale!r} is not one of {list(SCALES)}")
    check_singleton(singleton)
    rep, index = episode_rows(batch)
    device = batch.reward.device
    rep_t = torch.tensor(rep, dtype=torch.long, device=device)
    per_episode = normalize_rewards(batch.reward[rep_t], batch.group_ids.to(device)[rep_t], scale, eps, singleton)
    batch.stats["supo/episodes"] = float(len(rep))
    batch.stats["supo/rows_per_episode"] = len(batch) / max(1, len(rep))
    batch.stats["supo/adv_abs_mean"] = float(per_episode.abs().mean()) if len(rep) else 0.0
    return per_episode[torch.tensor(index, dtype=torch.long, device=device)]
