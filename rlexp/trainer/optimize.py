"""The update: μ passes over one rollout batch, each pass one optimiser step accumulated over
micro-batches, with whole-batch loss normalisers (see ``aggregation``)."""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.algorithms.batch import RolloutBatch
from rlexp.algorithms.masks import loss_mask
from rlexp.trainer.policy import PromptGroups, token_logprobs, trim_window


def micro_batches(n: int, size: int, lengths: torch.Tensor | None = None, max_tokens: int | None = None,
                  prompt_lengths: torch.Tensor | None = None, group_ids: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Row indices per micro-batch. Rows are sorted by completion length, longest first, so a
    micro-batch pads little; with ``group_ids`` whole groups stay together instead, ordered by their
    longest completion (their rows can share one prompt forward, at the price of padding every row to
    the group's longest). A micro-batch takes at most ``size`` rows (0: no limit) and, with
    ``max_tokens``, at most that many padded positions, rows × (longest prompt + longest completion in
    it; ``prompt_lengths``, ``lengths``): long rows train in small micro-batches, short rows in large
    ones (verl's ``use_dynamic_bsz``); a row over the budget goes alone. The whole-batch loss
    normalisers make the gradient independent of the split."""
    size = size if size > 0 else n
    order = torch.arange(n) if lengths is None else torch.argsort(lengths, descending=True, stable=True)
    if group_ids is not None and lengths is not None:
        _, inv = torch.unique(group_ids, return_inverse=True)
        group_max = torch.zeros(int(inv.max()) + 1, dtype=lengths.dtype).scatter_reduce(0, inv, lengths, "amax")[inv]
        order = order[torch.argsort(group_ids[order], stable=True)]
        order = order[torch.argsort(group_max[order], descending=True, stable=True)]
    if not max_tokens:
        return [order[i:i + size] for i in range(0, n, size)]
    if lengths is None or prompt_lengths is None:
        raise ValueError("micro_batches: max_tokens needs the rows' lengths and prompt_lengths")
    out, start, p_max, c_max = [], 0, 0, 0
    for i, row in enumerate(order.tolist()):
        p, c = max(p_max, int(prompt_lengths[row])), max(c_max, int(lengths[row]))
        rows = i - start + 1
        if rows > 1 and (rows > size or rows * (p + c) > max_tokens):
            out.append(order[start:i])
            start, p, c = i, int(prompt_lengths[row]), int(lengths[row])
        p_max, c_max = p, c
    out.append(order[start:])
    return out


class MicroBatch:
    """One micro-batch's rows, its padding-free column window and which rows share a prompt, worked
    out on the host from one copy of the batch's prompt ids and masks, so neither slicing nor the
    shared prompt forward needs a device round trip per micro-batch; ``to(device)`` then moves the
    row index and the prompt grouping in one go."""

    def __init__(self, idx: torch.Tensor, prompt_ids_cpu, prompt_mask_cpu, completion_mask_cpu,
                 find_groups: bool = True):
        self.idx = self.dev_idx = idx
        self.start, self.end = trim_window(prompt_mask_cpu[idx], completion_mask_cpu[idx])
        pm, n_rows = prompt_mask_cpu[idx, self.start:], len(idx)
        self.prompt_groups = None   # None: no prompt repeats, or not looked for
        self._labels = None         # per row: which of the micro-batch's distinct prompts it has
        prompt_rows = torch.arange(n_rows)   # rows whose prompt goes through the model
        if find_groups:
            _, self._labels = torch.unique(prompt_ids_cpu[idx, self.start:], dim=0, return_inverse=True)
            prompt_rows = torch.zeros(int(self._labels.max()) + 1, dtype=torch.long).scatter_(0, self._labels, prompt_rows)
        # positions the forward runs (padding included) and how many of them are real tokens
        self.positions = len(prompt_rows) * pm.shape[1] + n_rows * self.end
        self.tokens = int(pm[prompt_rows].sum() + completion_mask_cpu[idx].sum())

    def to(self, device) -> "MicroBatch":
        self.dev_idx = self.idx.to(device)
        if self._labels is not None:
            self.prompt_groups = PromptGroups.from_index(self._labels, device)
        return self

    def rows(self, batch: RolloutBatch):
        """prompt ids, prompt mask, completion ids, completion mask of the rows, trimmed; and ``end``."""
        i, s, e = self.dev_idx, self.start, self.end
        return (batch.prompt_ids[i, s:], batch.prompt_mask[i, s:], batch.completion_ids[i, :e],
                batch.completion_mask[i, :e], e)


def plan_micro_batches(batch: RolloutBatch, micro_batch: int, share_prompts: bool = True,
                       max_tokens: int | None = None) -> list[MicroBatch]:
    """``micro_batches`` of the batch, with each one's trimmed window (see ``trim``) and, with
    ``share_prompts``, which of its rows share a prompt. Without sharing, rows are cut by length:
    a group's completions differ in length, and keeping them together padded each to the group's
    longest — on one SmolLM2 rollout at 16 × 8 × 256 (``benchmarks/micro_batch_ab.py``) whole groups
    ran 40,768 padded positions (55 % padding; TRL's whole-batch padding: 40,960), rows by length
    21,728 (16 %). With sharing, whole groups run each prompt once per micro-batch instead of once per
    group member present, which wins when completions are short next to the prompt; so both plans are
    counted on the host and the one with fewer positions is taken (rows by length on a tie)."""
    p, pm, cm = batch.prompt_ids.cpu(), batch.prompt_mask.cpu(), batch.completion_mask.cpu()
    lengths, prompt_lengths = batch.lengths.cpu(), pm.sum(1)

    def plan(group_ids):
        return [MicroBatch(idx, p, pm, cm, share_prompts)
                for idx in micro_batches(len(batch), micro_batch, lengths, max_tokens, prompt_lengths, group_ids)]

    best = plan(None)
    if share_prompts:
        by_group = plan(batch.group_ids.cpu())
        if sum(mb.positions for mb in by_group) < sum(mb.positions for mb in best):
            best = by_group
    return [mb.to(batch.prompt_ids.device) for mb in best]


def _add(acc: dict, key: str, value: torch.Tensor, fold=torch.add) -> None:
    acc[key] = value if key not in acc else fold(acc[key], value)


def _to_host(acc: dict[str, torch.Tensor]) -> dict[str, float]:
    if not acc:
        return {}
    values = torch.stack([v.float().reshape(()) for v in acc.values()]).tolist()
    return dict(zip(acc.keys(), values))


@torch.no_grad()
def batch_logprobs(model, batch: RolloutBatch, micro_batch: int, temperature: float,
                   autocast_dtype: torch.dtype | None = None, share_prompts: bool = True,
                   micro_batch_tokens: int | None = None) -> torch.Tensor:
    """(N, T) log-probs of the batch's completion tokens under ``model`` (no grad)."""
    out = torch.zeros_like(batch.sampling_logprobs)
    for mb in plan_micro_batches(batch, micro_batch, share_prompts, micro_batch_tokens):
        p, pm, c, cm, end = mb.rows(batch)
        lp, _ = token_logprobs(model, p, pm, c, cm, temperature, autocast_dtype=autocast_dtype,
                               share_prompts=share_prompts and mb.prompt_groups is not None,
                               prompt_groups=mb.prompt_groups)
        out[mb.dev_idx, :end] = lp * cm
    return out


def policy_update(model, optimizer, scheduler, batch: RolloutBatch, algo: Algorithm, *, mu: int, micro_batch: int,
                  temperature: float, max_grad_norm: float | None,
                  autocast_dtype: torch.dtype | None = None, share_prompts: bool = True,
                  micro_batch_tokens: int | None = None) -> dict[str, float]:
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
            logp, entropy = token_logprobs(model, p, pm, c, cm, temperature, with_entropy=want_entropy,
                                           autocast_dtype=autocast_dtype, entropy_grad=bool(algo.entropy_coef),
                                           share_prompts=share_prompts and mb.prompt_groups is not None,
                                           prompt_groups=mb.prompt_groups)
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
        if not math.isfinite(gn):   # the one host read of the pass, besides the metrics
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
        sums.update(algo.critic.update(batch, mu=mu, micro_batch=micro_batch, autocast_dtype=autocast_dtype,
                                       micro_batch_tokens=micro_batch_tokens))
    return dict(sums)
