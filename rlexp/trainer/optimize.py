"""The update: μ epochs over one rollout batch, each epoch k optimiser steps on k mini-batches of whole
groups, each step accumulated over micro-batches with its mini-batch's loss normalisers (see
``aggregation``; k = 1: the whole batch's, so micro-batching never changes the loss)."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from rlexp.algorithms.aggregation import Normaliser, aggregate
from rlexp.algorithms.algorithm import Algorithm
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import token_logprobs
from rlexp.core.masks import IS_WEIGHTS, POLICY_TOKENS, REPLAYED, SUPPORT_IDX, loss_mask
from rlexp.core.micro_batches import group_mini_batches, plan_micro_batches


def _add(acc: dict, key: str, value: torch.Tensor, fold=torch.add) -> None:
    acc[key] = value if key not in acc else fold(acc[key], value)


# TRL's clip_ratio/low_min and /high_max: over the sequences of a step, the extreme of each sequence's clipped share
SEQ_EXTREMES = {"clip/low_frac": "clip/low_seq_min", "clip/high_frac": "clip/high_seq_max"}


def _add_seq_extremes(acc: dict, stats: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """Fold this micro-batch's per-sequence clipped shares into the optimiser step's min (low) / max (high), on the
    device (no host synchronisation; a micro-batch of empty rows gives ±inf, which the host fold skips)."""
    m = mask.float()
    empty = m.sum(-1) == 0
    for key, name in SEQ_EXTREMES.items():
        if key in stats:
            per_row = (stats[key].detach().float() * m).sum(-1) / m.sum(-1).clamp(min=1)
            if name.endswith("_min"):
                _add(acc, name, per_row.masked_fill(empty, float("inf")).min(), torch.minimum)
            else:
                _add(acc, name, per_row.masked_fill(empty, float("-inf")).max(), torch.maximum)


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
    topk: int = 0,
    action_mask=None,
    token_out: dict[str, torch.Tensor] | None = None,
    minp: float = 0.0,
    hidden_rank: dict | None = None,
    curvature_topk: int = 0,
):
    """(N, T) log-probs of the batch's completion tokens under ``model`` (no grad). With ``topk`` K > 0 also the
    (N, T, K) ids and log-probs of each position's K most likely tokens (TROLL's old support): a triple.
    ``token_out``: (N, T) tensors filled in the same forward — ``entropy`` (the token entropies: GTPO) and
    ``proxy_logp`` (the sampled token's log-prob under the min-p proxy with threshold ``minp``: Lp-Reg) and
    ``mean_logp`` (the vocabulary mean of the log-probs at each position: ROVER); and the (N, 3) ``hidden_rank``
    (VERL: each completion's hidden-state effective rank, its velocity and acceleration, with ``hidden_rank``'s
    {stride, center}; ``rlexp.algorithms.advantages.hidden_rank.rank_statistics``). ``curvature_topk`` K > 0 (CAPO):
    ``token_out["curvature"]`` (a dict, created if absent) receives the (N, T, d) final hidden states and the (N, T, K)
    ids and log-probs of each position's top-K tokens under ``rlexp.core.masks``' ``CURVATURE_*`` keys."""
    token_out = {} if token_out is None else token_out
    hidden = [] if "hidden_rank" in token_out else None
    if hidden is not None:
        from rlexp.algorithms.advantages.hidden_rank import rank_statistics
    curvature = token_out.setdefault("curvature", {}) if curvature_topk > 0 else None
    if curvature is not None:
        if topk > 0:
            raise ValueError("batch_logprobs: topk (TROLL's support) and curvature_topk (CAPO) both set")
        hidden = [] if hidden is None else hidden
    out = torch.zeros_like(batch.sampling_logprobs)
    if topk > 0:
        n, t = out.shape
        top_idx = torch.zeros(n, t, topk, dtype=torch.long, device=out.device)
        top_lp = torch.full((n, t, topk), float("-inf"), dtype=out.dtype, device=out.device)
        top_lp[..., 0] = 0.0  # padding positions: a point mass (finite everywhere, masked out of the loss)
    for mb in plan_micro_batches(batch, micro_batch, share_prompts, micro_batch_tokens):
        p, pm, c, cm, end = mb.rows(batch)
        res = token_logprobs(
            model,
            p,
            pm,
            c,
            cm,
            temperature,
            autocast_dtype=autocast_dtype,
            share_prompts=share_prompts and mb.prompt_groups is not None,
            prompt_groups=mb.prompt_groups,
            topk=topk if curvature is None else curvature_topk,
            vocab_mask=action_mask.vocab_mask(p, pm, c, cm, autocast_dtype) if action_mask is not None else None,
            with_entropy="entropy" in token_out,
            minp_proxy=minp if "proxy_logp" in token_out else 0.0,
            vocab_mean="mean_logp" in token_out,
            hidden_out=hidden,
        )
        out[mb.dev_idx, :end] = res[0] * cm
        last_hidden = hidden.pop() if hidden is not None else None
        if "hidden_rank" in token_out:  # reduced per micro-batch: the hidden states are never kept for the whole batch
            stats = rank_statistics(last_hidden, cm, hidden_rank["stride"], hidden_rank["center"])
            token_out["hidden_rank"][mb.dev_idx] = stats.to(token_out["hidden_rank"].dtype)
        if curvature is not None:  # CAPO: kept whole (its mask needs the advantages, computed after this forward)
            _keep_curvature_features(curvature, out.shape, mb.dev_idx, end, last_hidden, res[2])
        if "entropy" in token_out:
            token_out["entropy"][mb.dev_idx, :end] = res[1].to(out.dtype) * cm
        if "proxy_logp" in token_out:
            token_out["proxy_logp"][mb.dev_idx, :end] = res[2]["proxy_logp"].to(out.dtype) * cm
        if "mean_logp" in token_out:
            token_out["mean_logp"][mb.dev_idx, :end] = res[2]["mean_logp"].to(out.dtype) * cm
        if topk > 0:
            k = res[2]["topk_idx"].shape[-1]
            top_idx[mb.dev_idx, :end, :k] = res[2]["topk_idx"]
            top_lp[mb.dev_idx, :end, :k] = res[2]["topk_logp"].to(out.dtype)
    return (out, top_idx, top_lp) if topk > 0 else out


def _keep_curvature_features(into: dict, shape, rows, end: int, hidden: torch.Tensor, extra: dict) -> None:
    """Write one micro-batch's final hidden states and top-K ids / log-probs into CAPO's (N, T, ·) feature tensors,
    allocated at the first micro-batch."""
    from rlexp.core.masks import CURVATURE_HIDDEN, CURVATURE_TOPK_IDX, CURVATURE_TOPK_LOGP

    k = extra["topk_idx"].shape[-1]
    if not into:
        n, t = shape
        into[CURVATURE_HIDDEN] = hidden.new_zeros(n, t, hidden.shape[-1])
        into[CURVATURE_TOPK_IDX] = torch.zeros(n, t, k, dtype=torch.long, device=hidden.device)
        into[CURVATURE_TOPK_LOGP] = torch.zeros(n, t, k, dtype=torch.float32, device=hidden.device)
    into[CURVATURE_HIDDEN][rows, :end] = hidden.to(into[CURVATURE_HIDDEN].dtype)
    into[CURVATURE_TOPK_IDX][rows, :end] = extra["topk_idx"]
    into[CURVATURE_TOPK_LOGP][rows, :end] = extra["topk_logp"].float()


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
    steps_per_rollout: int = 1,
    seed: int = 0,
    slow_fast=None,
    stale: bool = False,
    action_mask=None,
    dist=None,
) -> dict[str, float]:
    """μ epochs over ``batch``, each epoch ``steps_per_rollout`` (k) optimiser steps, one per mini-batch of
    whole groups (``group_mini_batches``: a seeded split, the same in every epoch); returns metrics averaged
    over the μ·k steps. Each step's loss normalisers are its mini-batch's (verl's per-mini-batch loss; with
    k = 1 the whole batch's). With μ·k = 1 and no recorded old log-probs the update is on-policy: the old
    log-probs are the detached current ones (ratio exactly 1); otherwise ``batch.old_logprobs`` (recomputed
    before the update) or the sampler's. With a critic (``algo.critic``), μ critic passes follow on the
    whole batch. Micro-batches: at most ``micro_batch`` rows and ``micro_batch_tokens`` padded positions. A loss
    that selects tokens over the whole mini-batch (``algo.selects_over_mini_batch``: Clip-Cov, KL-Cov) gets the
    current log-probs of the mini-batch before each optimiser step (a no-grad forward; on the first step the
    recomputed old log-probs, which are the current ones), so its selection does not depend on micro-batching.

    ``slow_fast`` (SFPO, ``algorithm.slow_fast`` while it acts): the μ·k steps run K = ``fast_steps`` times (the
    fast trajectory, old log-probs fixed at the start), the weights are put back to θ_0 + α·(θ_K − θ_0), and
    the μ·k steps run once more (the slow correction): (K + 1)·μ·k optimiser steps in all.

    ``stale``: the batch was generated by older weights than the update starts from (trainer.async_rollout), so
    even with μ·k = 1 the ratio is against the old log-probs (recomputed, or else the sampler's), never 1.

    ``action_mask`` (NLPO's ``TopPActionMask``): every forward's log-probs are renormalised on the masking model's
    top-p tokens of each position.

    ``dist`` (``rlexp.trainer.distributed.Distributed``, several processes): ``batch`` is this process's share of
    the global batch; the mini-batches are split over the global groups, the loss normalisers count the global
    tokens and rows, the gradients are summed over the processes before clipping, and the metric sums are reduced
    over them, so every process takes the single-process step."""
    mask = loss_mask(batch)  # completion mask × per-row loss weights set by group stages (overlong masking)
    old = batch.old_logprobs if batch.old_logprobs is not None else batch.sampling_logprobs
    if steps_per_rollout > 1:
        split = group_mini_batches if dist is None else dist.mini_batches  # dist: this process's rows of each
        parts = [batch.select(rows) for rows in split(batch.group_ids, steps_per_rollout, seed)]
    else:
        parts = [batch]
    passes = 1 + (slow_fast.fast_steps if slow_fast is not None else 0)
    n_steps = mu * len(parts) * passes
    on_policy = n_steps == 1 and batch.old_logprobs is None and not stale
    steps = []  # per mini-batch: (rows' batch, mask, old log-probs, normaliser, token count, micro-batch plan)
    curvature = []  # CAPO: each mini-batch's curvature-mask counts
    for part in parts:
        part_mask = mask if part is batch else loss_mask(part)
        if algo.curvature_mask is not None:  # CAPO: tokens whose step the curvature model finds unstable leave the loss
            lr = optimizer.param_groups[0]["lr"]
            keep, counts = algo.curvature_mask(part, part_mask, lr=lr, temperature=temperature, optimizer=optimizer)
            part_mask = part_mask * keep
            curvature.append(counts)
        if part is batch:
            part_old = old
        else:
            part_old = part.old_logprobs if part.old_logprobs is not None else part.sampling_logprobs
        # dist: a mini-batch may hold none of this process's rows (it still joins the step's all-reduce)
        plan = plan_micro_batches(part, micro_batch, share_prompts, micro_batch_tokens) if len(part) else []
        norm = Normaliser.from_mask(part_mask, algo.count_empty_rows, algo.norm_length, algo.token_count_guard)
        steps.append((part, part_mask, part_old, norm, float(part_mask.sum().clamp(min=1)), plan))
    if dist is not None:  # global counts: each process's loss is its share of the global mini-batch's loss
        counts = dist.global_normalisers([norm for _, _, _, norm, _, _ in steps])
        steps = [(*step[:3], norm, count, step[5]) for step, (norm, count) in zip(steps, counts)]
    want_entropy = True
    sums: dict[str, float] = defaultdict(float)
    if curvature:
        from rlexp.algorithms.regularisers.curvature import CURVATURE_FEATURES, curvature_metrics

        sums.update(curvature_metrics(curvature))
        for k in CURVATURE_FEATURES:  # the features were sliced into the mini-batches and consumed there
            batch.extras.pop(k, None)
    plans = [mb for *_, plan in steps for mb in plan]
    positions = sum(mb.positions for mb in plans)
    n_plans, real_tokens = len(plans), sum(mb.tokens for mb in plans)
    if dist is not None:  # over all processes
        n_plans, real_tokens, positions = dist.sum_floats([n_plans, real_tokens, positions])
    sums["train/micro_batches"] = float(n_plans)
    sums["train/padding_share"] = 1.0 - real_tokens / max(positions, 1)
    sums["train/optimizer_steps"] = float(n_steps)
    mismatch = None  # the sampler's log-probs against the trainer's, before the first optimiser step
    slow = None
    if slow_fast is not None:
        from rlexp.trainer.slow_fast import snapshot

        slow = snapshot(model)
    epochs = [p for p in range(passes) for _ in range(mu)]  # the pass of each epoch
    # distributed=fsdp | deepspeed_zero*: each micro-batch's forward or backward is a collective, so every process
    # runs the most micro-batches any process has in each optimiser step (the others as idle passes:
    # rlexp.trainer.sharding); under DeepSpeed the engine runs the backward and the optimiser step (rlexp.trainer.zero)
    sharded = dist is not None and getattr(dist, "sharded", False)
    zero = dist.zero if sharded else None
    pads = dist.micro_batch_pads([len(plan) for *_, plan in steps]) if sharded else [0] * len(steps)
    if sharded:  # over all processes and epochs
        sums["train/idle_micro_batches"] = dist.sum_floats([sum(pads) * len(epochs)])[0]
    for e, pass_index in enumerate(epochs):
        if slow is not None and pass_index == passes - 1 and (e == 0 or epochs[e - 1] != pass_index):
            from rlexp.trainer.slow_fast import reposition

            sums["sfpo/fast_displacement"] = reposition(model, slow, slow_fast.step_size)
            sums["sfpo/active"] = 1.0
            slow = None
        for (part, part_mask, part_old, norm, token_count, plan), pad in zip(steps, pads):
            if zero is None:  # DeepSpeed's engine zeroes its gradients in its step
                optimizer.zero_grad(set_to_none=True)
            pass_sums: dict[str, torch.Tensor] = {}
            first_step = mismatch is None
            selected = None  # a loss that picks tokens over the whole mini-batch (Clip-Cov, KL-Cov) picks them here
            if algo.selects_over_mini_batch:
                if first_step and part.old_logprobs is not None:
                    current = part_old  # recomputed from these weights just before the update: the current log-probs
                else:
                    current = batch_logprobs(
                        model, part, micro_batch, temperature, autocast_dtype, share_prompts, micro_batch_tokens
                    )
                old_all = current if on_policy else part_old
                if getattr(algo.loss, "needs_batch", False):  # CoPG: group ids and reference log-probs
                    selected = algo.loss.select(current, old_all, part.advantages, part_mask, batch=part)
                else:
                    selected = algo.loss.select(current, old_all, part.advantages, part_mask)
                for k, v in getattr(algo.loss, "select_stats", {}).items():  # pairwise losses: means over the pairs
                    sums[k] += v / n_steps
            for mb in plan:
                dev_idx = mb.dev_idx
                p, pm, c, cm, end = mb.rows(part)
                support = part.extras[SUPPORT_IDX][dev_idx, :end] if algo.loss_support_k else None
                vmask = action_mask.vocab_mask(p, pm, c, cm, autocast_dtype) if action_mask is not None else None
                res = token_logprobs(
                    model,
                    p,
                    pm,
                    c,
                    cm,
                    temperature,
                    with_entropy=want_entropy,
                    autocast_dtype=autocast_dtype,
                    entropy_grad=algo.entropy_grad,
                    share_prompts=share_prompts and mb.prompt_groups is not None,
                    prompt_groups=mb.prompt_groups,
                    support=support,
                    vocab_mask=vmask,
                    entropy_clamp=algo.entropy_clamp,
                    vocab_mean=algo.loss_vocab_mean,
                )
                logp, entropy = res[0], res[1]
                support_logp = res[2]["support_logp"] if support is not None else None
                clamped = res[2]["clamped_entropy"] if algo.entropy_clamp else None
                old_lp = part_old[dev_idx, :end]
                replayed = part.extras.get(REPLAYED)
                replayed = replayed[dev_idx].bool()[:, None] if replayed is not None else None
                if on_policy:
                    old_lp = logp.detach()  # on-policy: the ratio is exactly 1 and its gradient ∇log π
                    if replayed is not None:  # replayed rows (RePO): against the policy that sampled them
                        old_lp = torch.where(replayed, part_old[dev_idx, :end], old_lp)
                adv = part.advantages[dev_idx]
                adv = adv[:, :end] if adv.dim() == 2 else adv
                lm = part_mask[dev_idx, :end]
                ref_lp = part.ref_logprobs[dev_idx, :end] if part.ref_logprobs is not None else None
                sel = selected[dev_idx, :end] if selected is not None else None
                extras = None
                if algo.token_loss_extras:  # per-row fields a loss reads (GBPO's target), this micro-batch's rows
                    extras = {
                        k: (v[dev_idx, :end] if v.dim() >= 2 else v[dev_idx])
                        for k in algo.token_loss_extras
                        if (v := part.extras.get(k)) is not None
                    }
                mean_lp = res[2]["mean_logp"] if algo.loss_vocab_mean else None  # ROVER: the next state's valuation
                out = algo.token_loss(
                    logp, old_lp, adv, lm, entropy, ref_lp, sel, extras, support_logp, clamped, vocab_mean_logp=mean_lp
                )
                per_token = out.per_token
                if IS_WEIGHTS in part.extras:  # train-inference mismatch correction (no gradient)
                    per_token = per_token * part.extras[IS_WEIGHTS][dev_idx, :end]
                loss = aggregate(per_token, lm, algo.aggregation, norm)
                if zero is None:
                    loss.backward()
                else:
                    zero.backward(loss)
                # metrics stay on the device (summed as tensors): one host synchronisation per pass, not
                # several per micro-batch, so the host keeps queueing the next micro-batch's kernels
                _add(pass_sums, "loss/total", loss.detach())
                _add(pass_sums, "entropy/mean", (entropy.detach() * lm).sum())
                for k, v in out.token_stats.items():
                    _add(pass_sums, k, (v.detach().float() * lm).sum())
                _add_seq_extremes(pass_sums, out.token_stats, lm)
                if "ratio/mean" in out.token_stats:
                    r, valid = out.token_stats["ratio/mean"].detach().float(), lm.bool()
                    _add(pass_sums, "ratio/max", r.masked_fill(~valid, float("-inf")).max(), torch.maximum)
                    _add(pass_sums, "ratio/min", r.masked_fill(~valid, float("inf")).min(), torch.minimum)
                if vmask is not None:  # NLPO: how many tokens the masking policy allows, per position
                    _add(pass_sums, "action_mask/allowed", (vmask.sum(-1).float() * lm).sum())
                if first_step:  # replayed rows were sampled by an earlier policy on purpose: not a mismatch
                    own = cm if replayed is None else cm * ~replayed
                    policy_tokens = part.extras.get(POLICY_TOKENS)  # multi-turn: not the environment's tokens
                    if policy_tokens is not None:
                        own = own * policy_tokens[dev_idx, :end].to(own.dtype)
                    add_mismatch(pass_sums, logp.detach(), part.sampling_logprobs[dev_idx, :end], own)
            if pad:
                from rlexp.trainer.sharding import idle_pass

                for _ in range(pad):
                    idle_pass(model, None if zero is None else zero.backward)
            pass_sums = _to_host(pass_sums)
            if dist is not None:  # the global optimiser step's sums and extremes
                pass_sums = dist.reduce_sums(pass_sums)
            for k, fold in (("ratio/max", max), ("ratio/min", min)):
                v = pass_sums.pop(k, None)
                if v is not None and abs(v) != float("inf"):
                    sums[k] = fold(sums[k], v) if k in sums else v
            for k in SEQ_EXTREMES.values():  # the optimiser step's extreme, averaged over the steps
                v = pass_sums.pop(k, None)
                if v is not None and abs(v) != float("inf"):
                    sums[k] += v / n_steps
            if first_step:
                mismatch = mismatch_metrics(pass_sums)
            if dist is not None and not sharded:  # the global gradient: the sum of the processes' shares
                dist.all_reduce_grads(model)  # (sharded: reduce-scattered as sums in each backward already)
            params = [q for q in model.parameters() if q.grad is not None]
            if algo.top_entropy_quantile < 1.0 and algo.top_entropy_normaliser == "selected":
                # token-mean over the selected tokens only: the loss divided by all tokens, times all / selected
                scale = token_count / max(pass_sums.get("entropy/selected_frac", 0.0), 1.0)
                for q in params:
                    q.grad.mul_(scale)
                pass_sums["loss/total"] *= scale
            if zero is not None:  # DeepSpeed: the engine clips and steps on the partitions, then zeroes the gradients
                gn = zero.step()
                if not math.isfinite(gn):
                    raise FloatingPointError(f"non-finite gradient norm ({gn}) under DeepSpeed (the step has run)")
            else:
                gn = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf"))
                gn = gn.full_tensor().item() if sharded else float(gn)  # sharded: a DTensor over the shards' norms
                if not math.isfinite(gn):  # the one host read of the pass, besides the metrics
                    optimizer.zero_grad(set_to_none=True)
                    raise FloatingPointError(f"non-finite gradient norm ({gn}): the update is not applied")
                optimizer.step()
            for k, v in getattr(optimizer, "last_metrics", {}).items():  # an optimiser's own (SPAM's clipped spikes)
                sums[k] += v / n_steps
            if scheduler is not None:
                scheduler.step()
            sums["grad_norm"] += gn / n_steps
            for k, v in pass_sums.items():
                sums[k] += (v if k == "loss/total" else v / token_count) / n_steps
    sums.update(mismatch or {})
    sums["lr"] = optimizer.param_groups[0]["lr"]
    if algo.critic is not None:
        sums.update(
            algo.critic.update(
                batch,
                mu=mu,
                micro_batch=micro_batch,
                autocast_dtype=autocast_dtype,
                micro_batch_tokens=micro_batch_tokens,
                dist=dist,  # distributed=ddp: every process's rows as one batch
            )
        )
    return dict(sums)


_MISMATCH = ("mismatch/kl", "mismatch/log_ratio_abs", "mismatch/ratio_max", "mismatch/ratio_min", "mismatch/tokens")


def add_mismatch(acc: dict, train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> None:
    """Accumulate the train–inference mismatch of one micro-batch on the device: with r = π_train/π_sampler
    per sampled token, Σ (r − 1 − log r) (the k3 estimate of KL(π_sampler ‖ π_train) on the sampler's
    tokens), Σ |log r|, max and min r, and the token count. The sampler is the rollout engine (a bf16 copy,
    vLLM), the trainer the policy's own forward before any update of this step."""
    m = mask.bool()
    log_r = (train_logp.float() - sampler_logp.float()).masked_fill(~m, 0.0)
    r = torch.exp(log_r)
    _add(acc, "mismatch/kl", ((r - 1 - log_r) * m).sum())
    _add(acc, "mismatch/log_ratio_abs", log_r.abs().sum())
    _add(acc, "mismatch/ratio_max", r.masked_fill(~m, float("-inf")).max(), torch.maximum)
    _add(acc, "mismatch/ratio_min", r.masked_fill(~m, float("inf")).min(), torch.minimum)
    _add(acc, "mismatch/tokens", m.sum())


def mismatch_metrics(host: dict[str, float]) -> dict[str, float]:
    """Pop the mismatch sums of ``add_mismatch`` from ``host`` and turn them into token means."""
    vals = {k: host.pop(k) for k in _MISMATCH if k in host}
    n = max(vals.pop("mismatch/tokens", 0.0), 1.0)
    out = {"mismatch/kl": vals["mismatch/kl"] / n, "mismatch/log_ratio_abs": vals["mismatch/log_ratio_abs"] / n}
    for k in ("mismatch/ratio_max", "mismatch/ratio_min"):
        if abs(vals[k]) != float("inf"):
            out[k] = vals[k]
    return out
