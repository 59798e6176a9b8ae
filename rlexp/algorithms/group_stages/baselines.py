"""Stages that produce a baseline for the advantage: ReMax's greedy completion per prompt."""

from __future__ import annotations

import time

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES


@GROUP_STAGES.register
def greedy_baseline(batch: RolloutBatch, ctx, key: str = "greedy_reward") -> RolloutBatch:
    """ReMax baseline: one greedy completion per prompt of the batch, scored by the same reward
    terms; its total reward goes to every row of the group as ``batch.extras[key]``. Stats:
    ``remax/greedy_reward_mean``, ``remax/greedy_length_mean``."""
    from rlexp.rewards.scoring import score

    rollout, terms = ctx.rollout, ctx.reward_terms
    if rollout is None or terms is None:
        raise RuntimeError("greedy_baseline needs the rollout engine and reward terms (ctx.rollout, ctx.reward_terms)")
    firsts = [i for i, g in enumerate(batch.group_ids.tolist()) if i == 0 or g != batch.group_ids[i - 1].item()]
    prompts = [batch.prompts[i] for i in firsts]
    dtype = ctx.autocast_dtype
    device = next(ctx.policy.parameters()).device
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = rollout.generate(ctx.policy, ctx.tokenizer, prompts, num_generations=1, greedy=True)
    gid = batch.group_ids[firsts]
    greedy = RolloutBatch.from_generation(out, gid, prompts, [batch.records[i] for i in firsts])
    t1 = time.perf_counter()
    score(greedy, terms)
    batch.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + time.perf_counter() - t1
    lookup = {int(g): float(r) for g, r in zip(gid.tolist(), greedy.reward.tolist())}
    batch.extras[key] = torch.tensor(
        [lookup[int(g)] for g in batch.group_ids.tolist()], dtype=torch.float32, device=batch.reward.device
    )
    batch.stats["remax/greedy_reward_mean"] = float(greedy.reward.mean())
    batch.stats["remax/greedy_length_mean"] = float(greedy.lengths.float().mean())
    batch.stats["time/greedy_generate_s"] = t1 - t0
    return batch
