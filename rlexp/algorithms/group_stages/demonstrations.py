"""Demonstration rows inside the RL batch, for the SFT–RL hybrids: LUFFY's off-policy rows in the group and CHORD's
expert rows beside the groups.

LUFFY ("Learning to Reason under Off-Policy Guidance", Yan et al., 2025; arXiv 2504.14945) replaces some of each
group's rollouts by an off-policy solution of the prompt, so the group's advantage is normalised over the mixed group
(on-policy and off-policy rewards together), and trains the off-policy rows with a shaped importance weight
(``rlexp.algorithms.losses.off_policy.PolicyShaping``). CHORD ("On-Policy RL Meets Off-Policy Experts: Harmonizing
SFT and RL via Dynamic Weighting", Zhang et al., 2025; arXiv 2508.11408) adds expert rows that take an SFT loss
beside the RL loss (``losses.off_policy.Chord``): they are no part of any group's advantage.

A record's demonstration is ``rlexp.data.demonstrations.demonstration(record, ctx.answer_format)``: the dataset's
worked solution written in the prompt's answer format. It is tokenized with ``ctx.tokenizer`` (no special tokens),
the policy's EOS appended, scored with the step's reward terms (``ctx.reward_terms``, as the rollouts were), and
marked ``extras["replayed"]`` (its ``sampling_logprobs`` are 0: the behaviour policy π_φ = 1 of LUFFY's released code,
the ratio's denominator; out of the reward metrics and the train-inference mismatch) and ``extras["demonstration"]``.
``extras["demo_part_weight"]`` gives every row N_tokens / N_tokens(its part) (parts: the demonstration rows, the
others), counted on the loss mask as it is here: the losses' per-part token means and per-part metrics.
"""

from __future__ import annotations

import math
import time

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import DEMO_PART_WEIGHT, DEMONSTRATION, LOSS_MASK, REPLAYED, TOKEN_LOSS_MASK, loss_mask
from rlexp.core.registry import GROUP_STAGES
from rlexp.data.demonstrations import demonstration
from rlexp.rewards.scoring import score

MODES = ("in_group", "separate")


@GROUP_STAGES.register
class Demonstrations:
    """Add each prompt's demonstration to the step's batch as extra rows (see the module doc).

    ``mode``: ``in_group`` (LUFFY) — the last ``per_group`` of each group's G rollouts are replaced by the
    demonstration (``per_group`` copies), so the group's advantage is normalised over the mixed group; ``separate``
    (CHORD) — ⌈``expert_ratio`` × the step's prompts⌉ prompts (the first ones, in batch order, that have a
    demonstration) each get ``per_group`` expert rows in a group of their own, after the step's groups.
    ``max_tokens``: a demonstration longer than this (EOS included) is left out and counted (null: any length).
    A record without a demonstration keeps its rollouts and is counted, never an error. The demonstrations are scored
    with the reward terms alone: place the stage before stages that add reward columns or reshape rewards (it refuses
    a batch whose reward columns are not the terms'), and after stages that refill the batch (dynamic sampling).

    Stats: ``demo/rows`` (demonstration rows added), ``demo/missing`` (prompts wanted whose record has none),
    ``demo/too_long`` (left out over ``max_tokens``), ``demo/replaced`` (rollouts dropped, in_group),
    ``demo/tokens_mean`` (their length), ``demo/reward_mean`` (their reward: ~1 for a correct solution in format)."""

    provides_extras = (DEMONSTRATION, DEMO_PART_WEIGHT)

    def __init__(
        self, mode: str = "in_group", per_group: int = 1, expert_ratio: float = 0.25, max_tokens: int | None = None
    ):
        if mode not in MODES:
            raise ValueError(f"group stage Demonstrations.mode={mode!r} is not one of {list(MODES)}")
        if per_group < 1:
            raise ValueError(f"group stage Demonstrations.per_group={per_group} must be >= 1")
        if not 0.0 < expert_ratio <= 1.0:
            raise ValueError(f"group stage Demonstrations.expert_ratio={expert_ratio} must be in (0, 1]")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"group stage Demonstrations.max_tokens={max_tokens} must be >= 1 or null")
        self.mode, self.per_group, self.expert_ratio, self.max_tokens = mode, int(per_group), expert_ratio, max_tokens

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if batch.rewards is None or batch.reward is None:
            raise RuntimeError("group stage Demonstrations runs after the reward stage (it scores its rows alike)")
        terms = getattr(ctx, "reward_terms", None)
        if not terms:
            raise RuntimeError("group stage Demonstrations needs the step's reward terms (ctx.reward_terms)")
        fmt = getattr(ctx, "answer_format", None) or "hash"
        eos = _eos_id(ctx)
        groups = _groups(batch)
        want = len(groups) if self.mode == "in_group" else math.ceil(self.expert_ratio * len(groups) - 1e-9)
        plan, missing, too_long = [], 0, 0  # plan: (group's rows, token ids, text)
        for rows in groups:
            if len(plan) >= want:
                break
            if self.mode == "in_group" and self.per_group >= len(rows):
                raise ValueError(
                    f"group stage Demonstrations.per_group={self.per_group} must be below the group's {len(rows)} "
                    "completions (trainer.num_generations): some rollouts must stay in the group"
                )
            text = demonstration(batch.records[rows[0]], fmt)
            if text is None:
                missing += 1
                continue
            ids = list(ctx.tokenizer(text, add_special_tokens=False)["input_ids"]) + [eos]
            if self.max_tokens is not None and len(ids) > self.max_tokens:
                too_long += 1
                continue
            plan.append((rows, ids, text))
        stats = {
            "demo/rows": float(len(plan) * self.per_group),
            "demo/missing": float(missing),
            "demo/too_long": float(too_long),
            "demo/replaced": float(len(plan) * self.per_group if self.mode == "in_group" else 0),
        }
        device = batch.completion_ids.device
        if not plan:  # nothing added: no replay mark, so the update takes its plain path
            batch.extras[DEMONSTRATION] = torch.zeros(len(batch), dtype=torch.bool, device=device)
            batch.extras[DEMO_PART_WEIGHT] = torch.ones(len(batch), device=device)
            batch.stats.update(stats)
            return batch
        t0 = time.perf_counter()
        next_id = int(batch.group_ids.max()) + 1
        gids = [
            int(batch.group_ids[rows[0]]) if self.mode == "in_group" else next_id + j
            for j, (rows, _, _) in enumerate(plan)
        ]
        demo = self.rows(batch, plan, gids)
        score(demo, terms)
        if demo.reward_names != batch.reward_names:
            raise RuntimeError(
                f"group stage Demonstrations: the batch's reward columns {batch.reward_names} are not the reward "
                f"terms' {demo.reward_names}: place the stage before stages that add reward columns"
            )
        elapsed = time.perf_counter() - t0
        stats["demo/tokens_mean"] = float(demo.completion_mask.sum(-1).float().mean())
        stats["demo/reward_mean"] = float(demo.reward.float().mean())
        n = len(batch)
        batch.extras.setdefault(REPLAYED, torch.zeros(n, dtype=torch.bool, device=device))
        batch.extras[DEMONSTRATION] = torch.zeros(n, dtype=torch.bool, device=device)
        demo.extras[REPLAYED] = torch.ones(len(demo), dtype=torch.bool, device=device)
        demo.extras[DEMONSTRATION] = torch.ones(len(demo), dtype=torch.bool, device=device)
        aside = {k: batch.extras.pop(k) for k in [k for k, v in batch.extras.items() if not _per_row(v, n)]}
        demo.extras = {k: v for k, v in demo.extras.items() if _per_row(v, len(demo))}
        _align_extras(batch, demo)
        merged = RolloutBatch.concat([batch, demo])
        batch.extras.update(aside)
        out = merged.select(self.order(groups, plan, n))
        out.extras.update(aside)  # not per row: kept as they are
        out.stats = dict(batch.stats)
        out.stats["time/reward_s"] = out.stats.get("time/reward_s", 0.0) + elapsed  # the trainer's refill time
        out.stats.update(stats)
        out.extras[DEMO_PART_WEIGHT] = part_weights(loss_mask(out), out.extras[DEMONSTRATION])
        return out

    def order(self, groups: list[list[int]], plan: list, n: int) -> list[int]:
        """Row order of [batch, demonstration rows]: in_group, each group's kept rollouts then its demonstrations
        (the last ``per_group`` rollouts dropped); separate, the batch then the expert groups."""
        k = self.per_group
        if self.mode == "separate":
            return list(range(n + len(plan) * k))
        demo_of = {rows[0]: j for j, (rows, _, _) in enumerate(plan)}
        order = []
        for rows in groups:
            j = demo_of.get(rows[0])
            if j is None:
                order.extend(rows)
            else:
                order.extend(rows[: len(rows) - k])
                order.extend(range(n + j * k, n + (j + 1) * k))
        return order

    def rows(self, batch: RolloutBatch, plan: list, gids: list[int]) -> RolloutBatch:
        """The demonstration rows (``per_group`` per planned prompt), unscored: the prompt of the group's first row,
        the demonstration's tokens, sampling log-probs 0, not truncated."""
        k = self.per_group
        device = batch.completion_ids.device
        src = [rows[0] for rows, _, _ in plan for _ in range(k)]
        width = max(len(ids) for _, ids, _ in plan)
        ids = torch.zeros(len(src), width, dtype=batch.completion_ids.dtype, device=device)
        mask = torch.zeros(len(src), width, dtype=batch.completion_mask.dtype, device=device)
        for j, (_, tokens, _) in enumerate(plan):
            t = torch.tensor(tokens, dtype=ids.dtype, device=device)
            ids[j * k : (j + 1) * k, : len(tokens)] = t
            mask[j * k : (j + 1) * k, : len(tokens)] = 1
        index = torch.tensor(src, dtype=torch.long, device=batch.prompt_ids.device)
        return RolloutBatch(
            prompt_ids=batch.prompt_ids[index].clone(),
            prompt_mask=batch.prompt_mask[index].clone(),
            completion_ids=ids,
            completion_mask=mask,
            sampling_logprobs=torch.zeros(len(src), width, dtype=batch.sampling_logprobs.dtype, device=device),
            truncated=torch.zeros(len(src), dtype=batch.truncated.dtype, device=batch.truncated.device),
            group_ids=torch.tensor(
                [g for g in gids for _ in range(k)], dtype=batch.group_ids.dtype, device=batch.group_ids.device
            ),
            prompts=[batch.prompts[i] for i in src],
            completions=[text for _, _, text in plan for _ in range(k)],
            records=[batch.records[i] for i in src],
        )


def part_weights(mask: torch.Tensor, demo: torch.Tensor) -> torch.Tensor:
    """(N,) N / N_part per row: N the loss tokens of the batch, N_part those of the row's part (demonstration rows or
    the others); 0 for a part without tokens. Σ_t l·m·w / N = Σ_parts mean over the part's tokens of l."""
    per_row = mask.float().sum(-1)
    demo = demo.bool().to(per_row.device)
    total, in_demo = per_row.sum(), per_row[demo].sum()
    rest = total - in_demo
    w_demo = total / in_demo if in_demo > 0 else torch.zeros_like(total)
    w_rest = total / rest if rest > 0 else torch.zeros_like(total)
    return torch.where(demo, w_demo, w_rest).float()


def _eos_id(ctx) -> int:
    """The token the rollout stops at: the policy's generation config's (the first of a list), else the
    tokenizer's EOS."""
    config = getattr(getattr(ctx, "policy", None), "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None:
        eos = getattr(ctx.tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("group stage Demonstrations: neither the policy nor the tokenizer names an EOS token")
    return int(eos)


def _groups(batch: RolloutBatch) -> list[list[int]]:
    """Row indices of each group, in batch order (a group's rows are contiguous)."""
    out: list[list[int]] = []
    last = None
    for i, g in enumerate(batch.group_ids.tolist()):
        if g != last:
            out.append([])
            last = g
        out[-1].append(i)
    return out


def _per_row(v, n: int) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n


def _align_extras(batch: RolloutBatch, demo: RolloutBatch) -> None:
    """Give both parts the same per-row extras: a key one part lacks is filled for its rows — loss weights with 1,
    anything else with 0; token-aligned (N, T, ...) tensors at the part's own completion width."""
    parts = (batch, demo)
    for key in sorted({*batch.extras, *demo.extras}):
        have = [p for p in parts if key in p.extras]
        if len(have) == 2:
            continue
        src, dst = have[0], next(p for p in parts if key not in p.extras)
        v = src.extras[key]
        shape = list(v.shape[1:])
        if v.dim() >= 2 and v.shape[1] == src.completion_ids.shape[1]:
            shape[0] = dst.completion_ids.shape[1]
        fill = 1 if key in (LOSS_MASK, TOKEN_LOSS_MASK) else 0
        dst.extras[key] = torch.full((len(dst), *shape), fill, dtype=v.dtype, device=v.device)
