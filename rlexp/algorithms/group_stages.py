"""Group stages: ``stage(batch, ctx) -> batch``, run in order after the rewards and before the
advantages (listed in ``algorithm.group_stages``; configs bind their settings with ``_partial_``).

* ``dynamic_sampling``  DAPO's dynamic sampling: drop groups whose rewards do not vary, refill
                         with fresh groups through ``ctx.sample`` (at most ``max_rounds`` rounds).
* ``overlong_mask``     DAPO's overlong filtering: truncated completions leave the loss.
* ``overlong_penalty``  DAPO's soft overlong punishment, added as a reward term ``overlong``.
* ``greedy_baseline``   ReMax's baseline: the reward of one greedy completion per prompt.

(DAPO: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", 2025.)
"""
from __future__ import annotations

import logging
import math
import time

import torch

from rlexp.algorithms.advantages import group_stats
from rlexp.algorithms.batch import RolloutBatch
from rlexp.algorithms.masks import LOSS_MASK

log = logging.getLogger(__name__)


def _setting(ctx, name: str, default=None):
    settings = getattr(ctx, "settings", None)
    value = getattr(settings, name, None) if settings is not None else None
    return default if value is None else value


def _metric_values(batch: RolloutBatch, metric: str | None) -> torch.Tensor:
    if metric in (None, "reward"):
        return batch.reward
    if metric not in batch.reward_names:
        raise KeyError(f"group stage metric={metric!r} is not a reward term (terms: {batch.reward_names})")
    return batch.term(metric)


def varied_groups(batch: RolloutBatch, metric: str | None = None, tol: float = 1e-8) -> torch.Tensor:
    """Row indices of the groups (of two or more rows) whose ``metric`` has a std above ``tol``."""
    values = _metric_values(batch, metric)
    if len(batch) == 0:
        return torch.zeros(0, dtype=torch.long)
    _, std, count = group_stats(values, batch.group_ids)
    keep = (std > tol) & (count > 1)
    return keep.nonzero().squeeze(-1).cpu()


def _first_groups(batch: RolloutBatch, n_groups: int) -> RolloutBatch:
    seen: list[int] = []
    rows = []
    for i, g in enumerate(batch.group_ids.tolist()):
        if g not in seen:
            if len(seen) == n_groups:
                continue
            seen.append(g)
        rows.append(i)
    return batch.select(rows)


def dynamic_sampling(batch: RolloutBatch, ctx, max_rounds: int = 3, metric: str | None = None,
                     target_groups: int | None = None, oversample: float = 1.0, tol: float = 1e-8) -> RolloutBatch:
    """DAPO dynamic sampling: keep only groups whose ``metric`` (a reward term name; ``None`` = the
    total reward) varies, and refill by sampling fresh prompts with ``ctx.sample`` until
    ``target_groups`` (default ``trainer.prompts_per_step``) groups are kept or ``max_rounds`` refill
    rounds are spent; surplus groups are dropped (kept in arrival order). Each round asks for
    ⌈(missing groups)·``oversample``⌉ prompts. If the rounds run out short, the step trains on the
    groups it has (DAPO's code would raise); if no group varies at all, the original batch is kept
    (its advantages are 0 — our choice, so the step still runs).
    Stats: ``dynamic_sampling/{rounds,kept_groups,dropped_groups,sampled_groups}``."""
    if max_rounds < 0:
        raise ValueError(f"dynamic_sampling.max_rounds={max_rounds} must be >= 0")
    if oversample < 1.0:
        raise ValueError(f"dynamic_sampling.oversample={oversample} must be >= 1")
    target = int(target_groups or _setting(ctx, "prompts_per_step", batch.num_groups))
    if target < 1:
        raise ValueError(f"dynamic_sampling.target_groups={target} must be >= 1")
    sampled, rounds, refill_reward_s = batch.num_groups, 0, 0.0
    kept = batch.select(varied_groups(batch, metric, tol))
    parts = [kept] if len(kept) else []
    n_kept = kept.num_groups
    while n_kept < target and rounds < max_rounds:
        rounds += 1
        fresh = ctx.sample(math.ceil((target - n_kept) * oversample))
        refill_reward_s += fresh.stats.pop("time/reward_s", 0.0)
        sampled += fresh.num_groups
        good = fresh.select(varied_groups(fresh, metric, tol))
        if len(good):
            parts.append(good)
            n_kept += good.num_groups
    if parts:
        out = _first_groups(RolloutBatch.concat(parts) if len(parts) > 1 else parts[0], target)
    else:
        log.warning("dynamic_sampling: no group with varying %s after %d refill rounds; keeping the batch",
                    metric or "reward", rounds)
        out = batch
    out.stats = dict(batch.stats)
    if refill_reward_s:
        out.stats["time/reward_s"] = out.stats.get("time/reward_s", 0.0) + refill_reward_s
    kept_groups = out.num_groups if parts else 0
    out.stats.update({"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/kept_groups": float(kept_groups),
                      "dynamic_sampling/sampled_groups": float(sampled),
                      "dynamic_sampling/dropped_groups": float(sampled - kept_groups)})
    return out


def overlong_mask(batch: RolloutBatch, ctx=None) -> RolloutBatch:
    """DAPO overlong filtering: completions that hit the length limit (no EOS) get loss weight 0
    (``batch.extras["loss_mask"]``, see ``masks``). Their reward still enters the group statistics
    (TRL's ``mask_truncated_completions``). Stat: ``overlong/masked_frac``."""
    keep = (~batch.truncated.bool()).float()
    prev = batch.extras.get(LOSS_MASK)
    batch.extras[LOSS_MASK] = keep if prev is None else prev.float() * keep
    batch.stats["overlong/masked_frac"] = float(1.0 - keep.mean()) if len(batch) else 0.0
    return batch


def soft_overlong_punishment(lengths: torch.Tensor, max_length: float, cache_length: float) -> torch.Tensor:
    """DAPO Eq. 13: 0 for |y| ≤ L_max − L_cache; (L_max − L_cache − |y|)/L_cache up to L_max; −1 beyond."""
    lengths = lengths.float()
    free = max_length - cache_length
    ramp = (free - lengths) / cache_length
    return torch.where(lengths <= free, torch.zeros_like(lengths),
                       torch.where(lengths <= max_length, ramp, -torch.ones_like(lengths)))


def overlong_penalty(batch: RolloutBatch, ctx=None, max_length: float | None = None, cache_length: float | None = None,
                     cache_fraction: float = 0.2, weight: float = 1.0, name: str = "overlong") -> RolloutBatch:
    """DAPO soft overlong punishment as an extra reward term ``name`` (weight ``weight``), so it shows
    in ``reward/<name>/mean`` and in per-term estimators (GDPO). L_max = ``max_length`` (default
    ``trainer.max_new_tokens``), L_cache = ``cache_length`` or ``cache_fraction``·L_max (DAPO:
    L_max = 20480, L_cache = 4096, i.e. 0.2). Lengths count completion tokens including EOS."""
    L = float(max_length or _setting(ctx, "max_new_tokens", 0))
    if L <= 0:
        raise ValueError("overlong_penalty.max_length is not set and ctx.settings.max_new_tokens is missing")
    cache = float(cache_length) if cache_length is not None else cache_fraction * L
    if not 0 < cache <= L:
        raise ValueError(f"overlong_penalty.cache_length={cache} must be in (0, max_length={L}]")
    if name in batch.reward_names:
        raise ValueError(f"overlong_penalty.name={name!r} is already a reward term")
    pen = soft_overlong_punishment(batch.lengths, L, cache).to(batch.reward.device)
    w = torch.tensor([float(weight)], device=batch.reward.device)
    batch.rewards = torch.cat([batch.rewards, pen[:, None]], 1)
    batch.reward_failures = torch.cat([batch.reward_failures, torch.zeros_like(pen, dtype=torch.bool)[:, None]], 1)
    batch.reward_weights = torch.cat([batch.reward_weights.float(), w])
    batch.reward_names = [*batch.reward_names, name]
    batch.reward = batch.reward + weight * pen
    return batch


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
    greedy = RolloutBatch(
        prompt_ids=out.prompt_ids, prompt_mask=out.prompt_mask, completion_ids=out.completion_ids,
        completion_mask=out.completion_mask, sampling_logprobs=out.logprobs, truncated=out.truncated,
        group_ids=gid, prompts=prompts, completions=out.texts, records=[batch.records[i] for i in firsts])
    t1 = time.perf_counter()
    score(greedy, terms)
    batch.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + time.perf_counter() - t1
    lookup = {int(g): float(r) for g, r in zip(gid.tolist(), greedy.reward.tolist())}
    batch.extras[key] = torch.tensor([lookup[int(g)] for g in batch.group_ids.tolist()], dtype=torch.float32,
                                     device=batch.reward.device)
    batch.stats["remax/greedy_reward_mean"] = float(greedy.reward.mean())
    batch.stats["remax/greedy_length_mean"] = float(greedy.lengths.float().mean())
    batch.stats["time/greedy_generate_s"] = t1 - t0
    return batch
