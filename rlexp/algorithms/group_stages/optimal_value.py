"""A*-PO's optimal value — "Accelerating RL for LLM Reasoning with Optimal Advantage Regression" (Brantley et al.,
2025; arXiv 2505.20686; released code ZhaolinGao/A-PO: ``verl/utils/dataset/rl_dataset.py``, ``verl/trainer/apo/``).

Stage 1 of A*-PO estimates, for every prompt x, the optimal KL-regularised value under the reference policy from N
of its samples y_1..y_N ~ π_ref(·|x):

    V*(x) = β1 · log( (1/N) · Σ_i exp(r(x, y_i) / β1) ),

(the release: ``num_gen_to_use`` = 8 samples, β1 = 0.5, computed offline over the whole training set before
training). Here the stage estimates it on the first sight of each prompt: it samples N completions of the prompt
from the frozen reference model (``ctx.reference.model``, the initial policy) with the run's rollout, scores them
with the run's reward terms, and caches V* under the prompt's id (the record's ``id``, else its rendered prompt);
a later sight reads the cache. The samples are independent of training (π_ref is frozen), so this is the paper's
offline pass, done lazily. The cache is the stage's ``state_dict`` (kept by checkpoints for resume).

Every row gets its prompt's V* in ``batch.extras[key]``; the advantage ``advantages.baselines.remax`` with the same
``key`` gives A = r − V*, the regression target of the loss (``losses.optimal_advantage``).

Metrics: ``a_star_po/v_star_mean`` (over the batch's rows), ``a_star_po/new_prompts`` (prompts estimated this step),
``a_star_po/cache_size``, ``a_star_po/ref_reward_mean`` (mean reward of this step's reference samples; absent when
every prompt was cached), ``time/a_star_po_generate_s``; the samples' scoring time goes to ``time/reward_s``.
"""

from __future__ import annotations

import math
import time

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES


def optimal_value(rewards: torch.Tensor, beta1: float) -> torch.Tensor:
    """V* = β1 · log mean_i exp(r_i / β1) over the last dimension (a stable log-mean-exp)."""
    if beta1 <= 0:
        raise ValueError(f"A*-PO beta1={beta1} must be > 0")
    r = rewards.double() / beta1
    n = r.shape[-1]
    return (beta1 * (torch.logsumexp(r, dim=-1) - math.log(n))).float()


def prompt_key(record, prompt: str) -> str:
    """The cache key of a row's prompt: the record's ``id`` when it has one, else the rendered prompt."""
    rid = record.get("id") if isinstance(record, dict) else None
    return f"id:{rid}" if rid is not None else f"prompt:{prompt}"


@GROUP_STAGES.register
class OptimalValue:
    """Group stage: A*-PO's V*(x) per prompt from ``samples`` N reference completions, cached per prompt (see the
    module doc). ``beta1``: β1 > 0 (the release's 0.5); ``key``: the ``batch.extras`` field the value goes to
    (read by ``advantages.baselines.remax``). Put it first among the group stages (it reads the run's reward
    terms, and the reward the samples get is the terms' weighted total)."""

    needs_reference = True  # the samples come from the frozen reference model

    def __init__(self, samples: int = 8, beta1: float = 0.5, key: str = "v_star"):
        where = "algorithm.group_stages: OptimalValue"
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ValueError(f"{where}.samples={samples!r} must be an integer >= 1")
        if not isinstance(beta1, (int, float)) or isinstance(beta1, bool) or not beta1 > 0:
            raise ValueError(f"{where}.beta1={beta1!r} must be > 0")
        if not key:
            raise ValueError(f"{where}.key is empty")
        self.samples, self.beta1, self.key = samples, float(beta1), key
        self.cache: dict[str, float] = {}

    def bind(self, algorithm) -> None:
        """V* is the value of the *initial* policy: refuse a reference that moves (EMA, policy copies)."""
        kind = getattr(getattr(algorithm, "reference", None), "kind", "frozen")
        if kind != "frozen":
            raise ValueError(
                f"algorithm.group_stages: OptimalValue samples V* from the frozen reference; algorithm.reference.kind="
                f"{kind!r} must be 'frozen'"
            )

    # ---- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"v_star": dict(self.cache)}

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.cache = {str(k): float(v) for k, v in state.get("v_star", {}).items()}

    # ---- the stage ------------------------------------------------------------------------------
    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if len(batch) == 0:
            return batch
        if batch.reward is None:
            raise RuntimeError("OptimalValue runs after the reward stage (the batch is not scored)")
        keys = [prompt_key(rec, p) for rec, p in zip(batch.records, batch.prompts)]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self.cache and k not in first:
                first[k] = i
        stats = {"a_star_po/new_prompts": float(len(first))}
        if first:
            rewards, seconds = self._sample(batch, ctx, list(first.values()))
            values = optimal_value(rewards, self.beta1)
            for k, v in zip(first, values.tolist()):
                self.cache[k] = float(v)
            stats["a_star_po/ref_reward_mean"] = float(rewards.mean())
            stats["time/a_star_po_generate_s"] = seconds
        v_star = torch.tensor([self.cache[k] for k in keys], dtype=torch.float32, device=batch.reward.device)
        batch.extras[self.key] = v_star
        stats["a_star_po/v_star_mean"] = float(v_star.mean())
        stats["a_star_po/cache_size"] = float(len(self.cache))
        batch.stats.update(stats)
        return batch

    def _sample(self, batch: RolloutBatch, ctx, rows: list[int]) -> tuple[torch.Tensor, float]:
        """(len(rows), N) rewards of N reference completions of each row's prompt, and the generation seconds."""
        from rlexp.rewards.scoring import score

        missing = [n for n in ("rollout", "reward_terms", "tokenizer") if getattr(ctx, n, None) is None]
        reference = getattr(getattr(ctx, "reference", None), "model", None)
        if reference is None:
            missing.append("reference")
        if missing:
            raise RuntimeError(f"OptimalValue needs the stage context's {missing} to sample V* from the reference")
        if getattr(ctx.rollout, "needs_records", False):
            raise ValueError(
                "algorithm.group_stages: OptimalValue samples single completions of each prompt: run it with a "
                f"single-turn rollout (rollout=hf or vllm), not {type(ctx.rollout).__name__}"
            )
        prompts = [batch.prompts[i] for i in rows]
        records = [batch.records[i] for i in rows]
        n = self.samples
        dtype = getattr(ctx, "autocast_dtype", None)
        device = next(reference.parameters()).device
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = ctx.rollout.generate(reference, ctx.tokenizer, prompts, num_generations=n)
        t1 = time.perf_counter()
        gid = torch.arange(len(rows), device=out.completion_ids.device).repeat_interleave(n)
        rolled = RolloutBatch.from_generation(
            out, gid, [p for p in prompts for _ in range(n)], [r for r in records for _ in range(n)]
        )
        score(rolled, ctx.reward_terms)
        batch.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + time.perf_counter() - t1
        return rolled.reward.detach().float().cpu().view(len(rows), n), t1 - t0
