"""Filters that drop or refill groups and mask rows (DAPO: dynamic sampling, overlong filtering; GPG's
resampling is dynamic sampling with a lower bar and the degenerate groups kept), and the reward-reliability filters:
PF-PPO's policy filtration (the rows of a group whose reward is trusted: its extremes) and ReST-GRPO's
reward-variance filter (the groups whose rewards vary enough to carry signal)."""

from __future__ import annotations

import logging
import math
import random

import torch

from rlexp.algorithms.group_stages.base import metric_values, stage_setting
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import LOSS_MASK
from rlexp.core.registry import GROUP_STAGES
from rlexp.core.stats import group_stats

log = logging.getLogger(__name__)


def varied_groups(batch: RolloutBatch, metric: str | None = None, tol: float = 1e-8) -> torch.Tensor:
    """Row indices of the groups (of two or more rows) whose ``metric`` has a std above ``tol``."""
    values = metric_values(batch, metric)
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


REFILLS = ("missing", "batch")


@GROUP_STAGES.register
def dynamic_sampling(
    batch: RolloutBatch,
    ctx,
    max_rounds: int = 3,
    metric: str | None = None,
    target_groups: int | None = None,
    oversample: float = 1.0,
    tol: float = 1e-8,
    min_varied_frac: float = 1.0,
    keep_degenerate: bool = False,
    refill: str = "missing",
) -> RolloutBatch:
    """Dynamic sampling: keep the groups whose ``metric`` (a reward term name; ``None`` = the total reward)
    varies, and refill by sampling fresh prompts with ``ctx.sample`` until the kept groups reach
    ``min_varied_frac`` × ``target_groups`` (default ``trainer.prompts_per_step``) or ``max_rounds`` refill
    rounds are spent. Each round asks for ⌈(target − kept)·``oversample``⌉ prompts (``refill=missing``) or a
    whole batch of ``target`` prompts (``refill=batch``: verl's DAPO recipe, GPG's trainer). The step then
    trains on ``target`` groups in arrival order: the varied ones (surplus dropped) and, with
    ``keep_degenerate``, the zero-variance groups of the last sampled batch after them, up to ``target``.

    * DAPO (``min_varied_frac=1``, ``keep_degenerate=false``): only varied groups, as many as the batch holds.
      If the rounds run out short, the step trains on the groups it has (DAPO's code would raise).
    * GPG (``min_varied_frac=0.5``, ``keep_degenerate=true``, ``refill=batch``; AMAP-ML/GPG
      ``open-r1/src/open_r1/gpg_trainer.py``, ``_generate_and_score_completions``): resample whole batches until
      at least half the groups seen are informative, then fill the batch with the last batch's degenerate
      groups; the share of varied groups, 1/α of GPG's rescaling, is then ≥ 0.5.

    If no group varies at all, the original batch is kept (its advantages are 0 — our choice, so the step
    still runs). Stats: ``dynamic_sampling/{rounds,kept_groups,dropped_groups,sampled_groups,varied_frac}``
    (``varied_frac``: share of the step's groups whose metric varies)."""
    if max_rounds < 0:
        raise ValueError(f"dynamic_sampling.max_rounds={max_rounds} must be >= 0")
    if oversample < 1.0:
        raise ValueError(f"dynamic_sampling.oversample={oversample} must be >= 1")
    if not 0.0 < min_varied_frac <= 1.0:
        raise ValueError(f"dynamic_sampling.min_varied_frac={min_varied_frac} must be in (0, 1]")
    if refill not in REFILLS:
        raise ValueError(f"dynamic_sampling.refill={refill!r} is not one of {list(REFILLS)}")
    target = int(target_groups or stage_setting(ctx, "prompts_per_step", batch.num_groups))
    if target < 1:
        raise ValueError(f"dynamic_sampling.target_groups={target} must be >= 1")
    needed = min_varied_frac * target - 1e-9
    sampled, rounds, refill_reward_s = batch.num_groups, 0, 0.0
    varied = varied_groups(batch, metric, tol)
    kept = batch.select(varied)
    last = batch  # the last sampled batch: its degenerate groups fill the step with keep_degenerate
    parts = [kept] if len(kept) else []
    n_kept = kept.num_groups
    while n_kept < needed and rounds < max_rounds:
        rounds += 1
        n = target if refill == "batch" else math.ceil((target - n_kept) * oversample)
        fresh = ctx.sample(n)
        refill_reward_s += fresh.stats.pop("time/reward_s", 0.0)
        sampled += fresh.num_groups
        good = fresh.select(varied_groups(fresh, metric, tol))
        last = fresh
        if len(good):
            parts.append(good)
            n_kept += good.num_groups
    n_varied = min(n_kept, target)
    if parts:
        if keep_degenerate and n_kept < target:
            keep = torch.ones(len(last), dtype=torch.bool)
            keep[varied_groups(last, metric, tol)] = False
            if keep.any():
                parts.append(last.select(keep.nonzero().squeeze(-1)))
        out = _first_groups(RolloutBatch.concat(parts) if len(parts) > 1 else parts[0], target)
    else:
        log.warning(
            "dynamic_sampling: no group with varying %s after %d refill rounds; keeping the batch",
            metric or "reward",
            rounds,
        )
        out, n_varied = batch, 0
    out.stats = dict(batch.stats)
    if refill_reward_s:
        out.stats["time/reward_s"] = out.stats.get("time/reward_s", 0.0) + refill_reward_s
    kept_groups = out.num_groups if parts else 0
    out.stats.update(
        {
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/kept_groups": float(kept_groups),
            "dynamic_sampling/sampled_groups": float(sampled),
            "dynamic_sampling/dropped_groups": float(sampled - kept_groups),
            "dynamic_sampling/varied_frac": n_varied / max(out.num_groups, 1),
        }
    )
    return out


@GROUP_STAGES.register
def overlong_mask(batch: RolloutBatch, ctx=None) -> RolloutBatch:
    """DAPO overlong filtering: completions that hit the length limit (no EOS) get loss weight 0
    (``batch.extras["loss_mask"]``, see ``masks``). Their reward still enters the group statistics
    (TRL's ``mask_truncated_completions``). Stat: ``overlong/masked_frac``."""
    keep = (~batch.truncated.bool()).float()
    prev = batch.extras.get(LOSS_MASK)
    batch.extras[LOSS_MASK] = keep if prev is None else prev.float() * keep
    batch.stats["overlong/masked_frac"] = float(1.0 - keep.mean()) if len(batch) else 0.0
    return batch


# ---- reward-reliability filters (issue 25): which rows of a group, which groups carry a reward worth training on ----
PF_STRATEGIES = ("best_worst", "best_random", "best_of_n")


def _rows_by_group(group_ids: list[int]) -> dict[int, list[int]]:
    by_group: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        by_group.setdefault(g, []).append(i)
    return by_group


def pf_keep(values: list[float], group_ids: list[int], strategy: str, k: int, rng: random.Random) -> list[int]:
    """The row indices PF-PPO's filter keeps, in row order: per group, its rows ranked by ``values`` (highest first,
    ties in row order), the best ``k`` and — ``best_worst`` — the worst ``k`` / — ``best_random`` — ``k`` drawn at
    random from the others / — ``best_of_n`` — no more. A group with no more rows than that is kept whole."""
    kept: list[int] = []
    for rows in _rows_by_group(group_ids).values():
        ranked = sorted(rows, key=lambda i: -values[i])
        if len(rows) <= (k if strategy == "best_of_n" else 2 * k):
            kept += rows
            continue
        kept += ranked[:k]
        if strategy == "best_worst":
            kept += ranked[-k:]
        elif strategy == "best_random":
            kept += rng.sample(ranked[k:], k)
    return sorted(kept)


def r_squared(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """The coefficient of determination of the least-squares line of ``y`` on ``x`` (the squared Pearson
    correlation); None when either does not vary (or fewer than two points)."""
    x, y = x.double(), y.double()
    if x.numel() < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy = float((dx * dx).sum()), float((dy * dy).sum())
    if sxx <= 1e-24 or syy <= 1e-24:
        return None
    return float((dx * dy).sum()) ** 2 / (sxx * syy)


@GROUP_STAGES.register
def policy_filtration(
    batch: RolloutBatch,
    ctx=None,
    strategy: str = "best_worst",
    k: int = 1,
    metric: str | None = None,
    score_term: str | None = None,
    seed: int = 0,
) -> RolloutBatch:
    """PF-PPO's policy filtration ("Policy Filtration in RLHF to Fine-Tune LLM for Code Generation", Zhang, Shen et
    al., 2024; arXiv 2409.06957): a reward model is reliable at the extremes of its scores and noisy in between, so
    each group (the completions of one prompt) keeps only rows whose reward can be trusted and the update trains on
    those (``pf_keep``): ``best_worst`` (the paper's BW: the ``k`` highest- and the ``k`` lowest-rewarded),
    ``best_random`` (BR: the ``k`` best and ``k`` others at random, seeded by ``seed`` and the step) or ``best_of_n``
    (BoN: the ``k`` best). ``metric``: the reward term ranked (None: the total reward). The dropped rows leave the
    batch before the advantages (PPO's GAE and critic, or a group baseline, see only the kept ones).

    ``score_term``: a term standing for the actual score (e.g. the verifiable accuracy beside a reward-model term):
    the paper chooses a strategy by the R² between reward and actual score on the filtered rows, logged as
    ``pfppo/r2_kept`` beside ``pfppo/r2_all`` (every row) when defined.

    A batch whose groups all hold no more rows than the strategy keeps is refused (nothing would be filtered: raise
    ``trainer.num_generations``). Stats: ``pfppo/kept_rows``, ``pfppo/dropped_rows``, ``pfppo/kept_frac``,
    ``pfppo/reward_kept_mean``, ``pfppo/reward_dropped_mean`` (the reward ranked, over the kept / dropped rows)."""
    if strategy not in PF_STRATEGIES:
        raise ValueError(f"policy_filtration.strategy={strategy!r} is not one of {list(PF_STRATEGIES)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"policy_filtration.k={k!r} must be an integer >= 1")
    if len(batch) == 0:
        return batch
    values = metric_values(batch, metric).float()
    gids = batch.group_ids.tolist()
    keep_per_group = k if strategy == "best_of_n" else 2 * k
    largest = max(len(rows) for rows in _rows_by_group(gids).values())
    if largest <= keep_per_group:
        raise ValueError(
            f"algorithm.group_stages: policy_filtration (strategy={strategy}, k={k}) keeps {keep_per_group} "
            f"completions of each group, but the groups hold at most {largest}: nothing is filtered; raise "
            f"trainer.num_generations above {keep_per_group}"
        )
    step = int(getattr(ctx, "step", 0) or 0)
    kept = pf_keep(values.tolist(), gids, strategy, k, random.Random(seed * 1_000_003 + step))
    dropped = torch.ones(len(batch), dtype=torch.bool)
    dropped[kept] = False
    stats = {
        "pfppo/kept_rows": float(len(kept)),
        "pfppo/dropped_rows": float(len(batch) - len(kept)),
        "pfppo/kept_frac": len(kept) / len(batch),
        "pfppo/reward_kept_mean": float(values[kept].mean()),
    }
    if dropped.any():
        stats["pfppo/reward_dropped_mean"] = float(values[dropped.to(values.device)].mean())
    if score_term is not None:
        score = metric_values(batch, score_term).float()
        for name, rows in (("kept", kept), ("all", list(range(len(batch))))):
            r2 = r_squared(values[rows], score[rows])
            if r2 is not None:
                stats[f"pfppo/r2_{name}"] = r2
    out = batch.select(kept)
    out.stats.update(stats)
    return out


def population_std(values: torch.Tensor, group_ids: torch.Tensor) -> dict[int, float]:
    """Each group's standard deviation of ``values`` without Bessel's correction (numpy's ``np.std``, as ReST-RL's
    code): 0 for a one-row group."""
    out = {}
    for g, rows in _rows_by_group(group_ids.tolist()).items():
        v = values[rows].double()
        out[g] = float(((v - v.mean()) ** 2).mean().sqrt())
    return out


@GROUP_STAGES.register
def reward_std_filter(
    batch: RolloutBatch,
    ctx=None,
    min_std: float = 0.05,
    metric: str | None = None,
    max_rounds: int = 0,
    target_groups: int | None = None,
) -> RolloutBatch:
    """ReST-GRPO's data filter ("ReST-RL: Achieving Accurate Code Reasoning of LLMs with Optimized Self-Training and
    Decoding", Zhoubian et al., 2025; arXiv 2508.19576; THUDM/ReST-RL ``experiment/process_gen_data.py``): a prompt
    whose sampled rewards hardly vary (population std < ``min_std``, the code's ``std_accept_threshold_grpo`` = 0.05)
    is dropped — GRPO's normalisation would turn its reward noise into full-size advantages — and the step trains
    on the groups of higher variance. ``metric``: the reward term (None: the total reward).

    ReST-RL filters a sampling pass before each GRPO iteration; here the filter acts on the step's own rollout, and
    ``max_rounds`` > 0 refills like DAPO's dynamic sampling (fresh prompts through ``ctx.sample``, at most that many
    rounds, until ``target_groups`` — default ``trainer.prompts_per_step`` — groups pass; the surplus dropped). If no
    group passes, the batch is kept with loss weight 0 on every row (``extras["loss_mask"]``): the step learns
    nothing rather than noise. Stats: ``restrl/reward_std_mean`` (mean std of the step's own groups, before the
    filter), ``restrl/kept_groups``, ``restrl/dropped_groups``, ``restrl/sampled_groups``, ``restrl/kept_frac``
    (kept / sampled groups), ``restrl/kept_std_mean``, ``restrl/rounds``."""
    if isinstance(min_std, bool) or not isinstance(min_std, (int, float)) or min_std < 0:
        raise ValueError(f"reward_std_filter.min_std={min_std!r} must be a number >= 0")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 0:
        raise ValueError(f"reward_std_filter.max_rounds={max_rounds!r} must be an integer >= 0")
    if len(batch) == 0:
        return batch
    target = int(target_groups or stage_setting(ctx, "prompts_per_step", batch.num_groups))
    if target < 1:
        raise ValueError(f"reward_std_filter.target_groups={target} must be >= 1")

    def passing(b: RolloutBatch) -> tuple[RolloutBatch, dict[int, float]]:
        stds = population_std(metric_values(b, metric), b.group_ids)
        good = {g for g, s in stds.items() if s >= min_std}
        rows = [i for i, g in enumerate(b.group_ids.tolist()) if g in good]
        return b.select(rows), {g: stds[g] for g in good}

    own_stds = population_std(metric_values(batch, metric), batch.group_ids)
    kept, kept_stds = passing(batch)
    parts = [kept] if len(kept) else []
    n_kept, sampled, rounds, refill_reward_s = len(kept_stds), batch.num_groups, 0, 0.0
    while n_kept < target and rounds < max_rounds:
        rounds += 1
        fresh = ctx.sample(target - n_kept)
        refill_reward_s += fresh.stats.pop("time/reward_s", 0.0)
        sampled += fresh.num_groups
        good, good_stds = passing(fresh)
        if len(good):
            parts.append(good)
            n_kept += len(good_stds)
    if parts:
        out = _first_groups(RolloutBatch.concat(parts) if len(parts) > 1 else parts[0], target)
        n_out = out.num_groups
    else:
        log.warning(
            "reward_std_filter: no group's %s std reaches %g: the step trains on nothing", metric or "reward", min_std
        )
        out, n_out = batch, 0
        prev = batch.extras.get(LOSS_MASK)
        zero = torch.zeros(len(batch), device=batch.completion_ids.device)
        out.extras[LOSS_MASK] = zero if prev is None else prev.float() * zero
    out.stats = dict(batch.stats)
    if refill_reward_s:
        out.stats["time/reward_s"] = out.stats.get("time/reward_s", 0.0) + refill_reward_s
    out.stats.update(
        {
            "restrl/reward_std_mean": sum(own_stds.values()) / len(own_stds),
            "restrl/kept_groups": float(n_out),
            "restrl/dropped_groups": float(sampled - n_out),
            "restrl/sampled_groups": float(sampled),
            "restrl/kept_frac": n_out / sampled,
            "restrl/rounds": float(rounds),
        }
    )
    if n_out:
        kept_stds = population_std(metric_values(out, metric), out.group_ids)
        out.stats["restrl/kept_std_mean"] = sum(kept_stds.values()) / len(kept_stds)
    return out
