"""The update: μ passes over one rollout batch, each pass one optimiser step accumulated over
micro-batches, with whole-batch loss normalisers (see ``aggregation``)."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import token_logprobs
from rlexp.core.masks import loss_mask
from rlexp.core.micro_batches import plan_micro_batches


def _add(acc: dict, key: str, value: torch.Tensor, fold=torch.add) -> None:
    acc[key] = value if key not in acc else fold(acc[key], value)


def _to_host(acc: dict[str, torch.Tensor]) -> dict[str, float]:
    if not acc:
        return {}
    values = torch.stack([v.float().reshape(()) for v in acc.values()]).tolist()
    return dict(zip(acc.keys(), values))


@torch.no_grad()
def batch_logprobs(
    model,
    batch: RolloutBatch,
    micro_batch: int,
    temperature: float,
    autocast_dtype: torch.dtype | None = None,
    share_prompts: bool = True,
    micro_batch_tokens: int | None = None,
) -> torch.Tensor:
    """(N, T) log-probs of the batch's completion tokens under ``model`` (no grad)."""
    out = torch.zeros_like(batch.sampling_logprobs)
    for mb in plan_micro_batches(batch, micro_batch, share_prompts, micro_batch_tokens):
        p, pm, c, cm, end = mb.rows(batch)
        lp, _ = token_logprobs(
            model,
            p,
            pm,
            c,
            cm,
            temperature,
            autocast_dtype=autocast_dtype,
            share_prompts=share_prompts and mb.prompt_groups is not None,
            prompt_groups=mb.prompt_groups,
        )
        out[mb.dev_idx, :end] = lp * cm
    return out


def policy_update(
    model,
    optimizer,
    scheduler,
    batch: RolloutBatch,
    algo: Algorithm,
    *,
    mu: int,
    micro_batch: int,
    temperature: float,
    max_grad_norm: float | None,
    autocast_dtype: torch.dtype | None = None,
    share_prompts: bool = True,
    micro_batch_tokens: int | None = None,
) -> dict[str, float]:
    """Run μ optimiser steps on ``batch``; returns metrics averaged over the passes. With a critic
    (``algo.critic``), μ critic passes follow on the same batch. Micro-batches: at most
    ``micro_batch`` rows and ``micro_batch_tokens`` padded positions (``micro_batches``)."""
    mask = loss_mask(batch)  # completion mask × per-row loss weights set by group stages (overlong masking)
    norm = Normaliser.from_mask(mask, algo.count_empty_rows, algo.norm_length)
    old = batch.old_logprobs if batch.old_logprobs is not None else batch.sampling_logprobs
    want_entropy = True
    sums: dict[str, float] = defaultdict(float)
    token_count = float(mask.sum().clamp(min=1))
    plan = plan_micro_batches(batch, micro_batch, share_prompts, micro_batch_tokens)
    positions = sum(mb.positions for mb in plan)
    sums["train/micro_batches"] = float(len(plan))
    sums["train/padding_share"] = 1.0 - sum(mb.tokens for mb in plan) / max(positions, 1)
    for _ in range(mu):
        optimizer.zero_grad(set_to_none=True)
        pass_sums: dict[str, torch.Tensor] = {}
        for mb in plan:
            dev_idx = mb.dev_idx
            p, pm, c, cm, end = mb.rows(batch)
            logp, entropy = token_logprobs(
                model,
                p,
                pm,
                c,
                cm,
                temperature,
                with_entropy=want_entropy,
                autocast_dtype=autocast_dtype,
                entropy_grad=bool(algo.entropy_coef),
                share_prompts=share_prompts and mb.prompt_groups is not None,
                prompt_groups=mb.prompt_groups,
            )
            old_lp = old[dev_idx, :end]
            if mu == 1 and batch.old_logprobs is None:
                old_lp = logp.detach()  # on-policy: the ratio is exactly 1 and its gradient ∇log π
            adv = batch.advantages[dev_idx]
            adv = adv[:, :end] if adv.dim() == 2 else adv
            lm = mask[dev_idx, :end]
            ref_lp = batch.ref_logprobs[dev_idx, :end] if batch.ref_logprobs is not None else None
            out = algo.token_loss(logp, old_lp, adv, lm, entropy, ref_lp)
            loss = aggregate(out.per_token, lm, algo.aggregation, norm)
            loss.backward()
            # metrics stay on the device (summed as tensors): one host synchronisation per pass, not
            # several per micro-batch, so the host keeps queueing the next micro-batch's kernels
            _add(pass_sums, "loss/total", loss.detach())
            _add(pass_sums, "entropy/mean", (entropy.detach() * lm).sum())
            for k, v in out.token_stats.items():
                _add(pass_sums, k, (v.detach().float() * lm).sum())
            if "ratio/mean" in out.token_stats:
                r, valid = out.token_stats["ratio/mean"].detach().float(), lm.bool()
                _add(pass_sums, "ratio/max", r.masked_fill(~valid, float("-inf")).max(), torch.maximum)
                _add(pass_sums, "ratio/min", r.masked_fill(~valid, float("inf")).min(), torch.minimum)
        pass_sums = _to_host(pass_sums)
        for k, fold in (("ratio/max", max), ("ratio/min", min)):
            v = pass_sums.pop(k, None)
            if v is not None and abs(v) != float("inf"):
                sums[k] = fold(sums[k], v) if k in sums else v
        params = [q for q in model.parameters() if q.grad is not None]
        gn = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf")))
        if not math.isfinite(gn):  # the one host read of the pass, besides the metrics
            optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm ({gn}): the update is not applied")
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        sums["grad_norm"] += gn / mu
        for k, v in pass_sums.items():
            sums[k] += (v if k == "loss/total" else v / token_count) / mu
    sums["lr"] = optimizer.param_groups[0]["lr"]
    if algo.critic is not None:
        sums.update(
            algo.critic.update(
                batch,
                mu=mu,
                micro_batch=micro_batch,
                autocast_dtype=autocast_dtype,
                micro_batch_tokens=micro_batch_tokens,
            )
        )
    return dict(sums)
