"""GRPO-CARE's adaptive consistency bonus ("GRPO-CARE: Consistency-Aware Reinforcement Learning for
Multimodal Reasoning", 2025), as a group stage.

What the released code does (TencentARC/GRPO-CARE, commit 03c3a7c,
``src/r1-v/src/open_r1/trainer/grpo_trainer_ref_ema.py``; settings from
``scripts/run_grpo_care_margin0_seed_bench_r1.sh``), restated:

1. Confidence of a sample = exp(mean log-prob of its answer tokens) under the *reference* model,
   given the prompt and the sample's own reasoning; capped at ``confidence_cap`` (0.95). The released code
   runs the reference on the sampled token ids (``prompt_completion_ids``) and takes the tokens after the
   ``<answer>`` token up to the closing tag (``get_thinking_answer_masks``).
2. Over the local batch of one device (one prompt × G = 8 completions in the released script, i.e.
   one group), a sample is *accurate* when its accuracy reward is > ``accuracy_floor`` (0.1) and
   ≥ the mean accuracy of that batch.
3. Threshold = mean capped confidence of the accurate samples − ``margin`` (0 for SEED-Bench-R1,
   0.01 for the general video run).
4. Bonus = ``coef`` (0.5) × accuracy for accurate samples whose capped confidence ≥ threshold,
   else 0. It is added to the summed rewards (accuracy + format) *before* the group mean/std
   normalisation.
5. No KL term (β = 0); the reference model is an EMA of the policy, ref ← 0.995·ref + 0.005·policy
   every 10 optimiser steps (``rlexp.algorithms.regularisers.reference``, ``algorithm.reference.kind=ema``).
6. Logged: the mean bonus (``rewards/bonus_rewards``), all-wrong / all-correct group ratios.

Here: the confidence is scored on the sampled token ids too (``sampled_answer_confidence``): the
reference model runs on the batch's prompt and completion ids, and the answer tokens are the sampled
tokens whose decoded characters overlap the stated answer (``rewards.answers.answer_span`` of the
decoded completion, in the prompt's answer format), found by decoding the sampled ids, never by
re-tokenising the text (which can split the same text into other tokens). ``scope=group`` (default)
takes the accuracy mean and the threshold over each group, which is what the released script computes
(its local batch is one group); ``scope=batch`` takes them over the whole step batch. A sample without
a parsable answer in the prompt's format has no confidence (NaN): it gets no bonus and does not enter
the threshold. (In the released code such a sample's empty answer mask gives confidence exp(0) = 1,
capped; it never gets a bonus there either, because its accuracy is 0 without an ``<answer>`` tag.)

The bonus is appended to the batch as a reward column (``name``, weight 1) so it is logged as
``reward/<name>/mean`` and summed into ``batch.reward``; per-row values go to ``batch.extras``.
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import token_logprobs
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.answers import answer_span

SCOPES = ("group", "batch")


def care_bonus(
    accuracy: torch.Tensor,
    confidence: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    coef: float = 0.5,
    accuracy_floor: float = 0.1,
    confidence_cap: float | None = 0.95,
    margin: float = 0.0,
    scope: str = "group",
) -> dict[str, torch.Tensor]:
    """The GRPO-CARE bonus for each row (see module doc).

    Returns per-row tensors: ``bonus``, ``accurate`` (bool), ``consistent`` (bool: accurate and
    capped confidence ≥ threshold), ``threshold`` (NaN where the unit has no accurate sample with a
    confidence), ``confidence`` (capped; NaN where no answer was parsed)."""
    if scope not in SCOPES:
        raise ValueError(f"care scope={scope!r} is not one of {SCOPES}")
    acc = accuracy.float()
    conf = confidence.float().to(acc.device)
    if confidence_cap is not None:
        conf = torch.where(torch.isnan(conf), conf, conf.clamp(max=confidence_cap))
    if scope == "batch":
        unit = torch.zeros_like(group_ids)
    else:
        unit = group_ids
    _, inv = torch.unique(unit, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    ones = torch.ones_like(acc)
    count = torch.zeros(k, device=acc.device).index_add_(0, inv, ones)
    mean_acc = (torch.zeros(k, device=acc.device).index_add_(0, inv, acc) / count)[inv]
    accurate = (acc > accuracy_floor) & (acc >= mean_acc)
    measured = accurate & ~torch.isnan(conf)
    n_meas = torch.zeros(k, device=acc.device).index_add_(0, inv, measured.float())
    s_meas = torch.zeros(k, device=acc.device).index_add_(0, inv, torch.where(measured, conf, torch.zeros_like(conf)))
    threshold = torch.where(n_meas > 0, s_meas / n_meas.clamp(min=1) - margin, torch.full_like(s_meas, float("nan")))[
        inv
    ]
    consistent = measured & (conf >= threshold)
    bonus = torch.where(consistent, coef * acc, torch.zeros_like(acc))
    return {"bonus": bonus, "accurate": accurate, "consistent": consistent, "threshold": threshold, "confidence": conf}


def answer_token_mask(
    tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor, answer_format: str = "auto"
) -> torch.Tensor:
    """(N, T) bool: the sampled completion tokens that state the answer. Each row's valid ids are decoded
    (special tokens skipped, as the rollout decodes its texts); the answer span is looked up in that text; a
    token belongs to the answer when the characters it adds to the decoded prefix overlap the span."""
    ids_cpu, mask_cpu = completion_ids.cpu(), completion_mask.cpu().bool()
    out = torch.zeros_like(mask_cpu)
    for i in range(len(ids_cpu)):
        positions = mask_cpu[i].nonzero().squeeze(-1).tolist()
        ids = ids_cpu[i, positions].tolist()
        span = answer_span(tokenizer.decode(ids, skip_special_tokens=True), answer_format)
        if span is None or span[1] <= span[0]:
            continue
        start = 0
        for j, pos in enumerate(positions):
            end = max(start, len(tokenizer.decode(ids[: j + 1], skip_special_tokens=True)))
            if end > start and end > span[0] and start < span[1]:
                out[i, pos] = True
            if end >= span[1]:
                break
            start = end
    return out.to(completion_mask.device)


@torch.no_grad()
def sampled_answer_confidence(
    model,
    tokenizer,
    batch: RolloutBatch,
    answer_format: str = "auto",
    batch_size: int = 16,
    autocast_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """(N,) exp(mean log p(answer tokens | prompt, preceding sampled tokens)) under ``model``, on the batch's
    sampled token ids (temperature 1, as the released code's reference log-probs); NaN where no token states an
    answer."""
    answer = answer_token_mask(tokenizer, batch.completion_ids, batch.completion_mask, answer_format)
    out = torch.full((len(batch),), float("nan"))
    rows = answer.any(-1).nonzero().squeeze(-1)
    for k in range(0, len(rows), batch_size):
        idx = rows[k : k + batch_size]
        logp, _ = token_logprobs(
            model,
            batch.prompt_ids[idx],
            batch.prompt_mask[idx],
            batch.completion_ids[idx],
            batch.completion_mask[idx],
            1.0,
            autocast_dtype=autocast_dtype,
            share_prompts=False,
        )
        a = answer[idx].float()
        mean = (logp.float() * a).sum(-1) / a.sum(-1)
        out[idx.cpu()] = torch.exp(mean).cpu()
    return out


def _mean(x: torch.Tensor) -> float:
    x = x.float()
    x = x[~torch.isnan(x)]
    return float(x.mean()) if x.numel() else math.nan


@GROUP_STAGES.register
class ConsistencyBonus:
    """Group stage: adds the GRPO-CARE consistency bonus to the reward (see module doc).

    Metrics (``batch.stats``):
      ``care/bonus_frac``          share of completions given a bonus;
      ``care/bonus_mean``          mean bonus over all completions (the released ``rewards/bonus_rewards``);
      ``care/confidence_mean``     mean reference confidence (uncapped) of completions with a parsable answer;
      ``care/answer_parsed_frac``  share of completions with a parsable answer (a confidence);
      ``care/accurate_frac``       share of completions that are accurate (floor and mean rule);
      ``care/consistency_rate``    consistent / accurate-with-a-confidence: the share of accurate
                                   completions whose capped confidence reaches their threshold
                                   (NaN, logged as null, when there is none);
      ``care/threshold_mean``      mean threshold over the groups (or the batch) that have one.
    """

    needs_reference = True

    def __init__(
        self,
        accuracy_term: str = "accuracy",
        coef: float = 0.5,
        accuracy_floor: float = 0.1,
        confidence_cap: float | None = 0.95,
        margin: float = 0.0,
        scope: str = "group",
        name: str = "care_bonus",
        batch_size: int = 16,
    ):
        if scope not in SCOPES:
            raise ValueError(f"algorithm.group_stages: ConsistencyBonus.scope={scope!r} is not one of {SCOPES}")
        if coef < 0:
            raise ValueError(f"algorithm.group_stages: ConsistencyBonus.coef={coef} must be >= 0")
        if confidence_cap is not None and not 0 < confidence_cap <= 1:
            raise ValueError(
                f"algorithm.group_stages: ConsistencyBonus.confidence_cap={confidence_cap} must be in (0, 1]"
            )
        if batch_size < 1:
            raise ValueError(f"algorithm.group_stages: ConsistencyBonus.batch_size={batch_size} must be >= 1")
        self.accuracy_term, self.coef, self.accuracy_floor = accuracy_term, float(coef), float(accuracy_floor)
        self.confidence_cap, self.margin, self.scope = confidence_cap, float(margin), scope
        self.name, self.batch_size = name, int(batch_size)

    def confidence(self, batch: RolloutBatch, ctx) -> torch.Tensor:
        """(N,) reference likelihood of each stated answer given its reasoning, on the sampled token ids (NaN: no
        answer)."""
        if ctx.reference is None or ctx.reference.model is None:
            raise RuntimeError(
                "ConsistencyBonus needs a reference model: set algorithm.reference.kind to ema or frozen"
            )
        return sampled_answer_confidence(
            ctx.reference.model,
            ctx.tokenizer,
            batch,
            ctx.answer_format,
            batch_size=self.batch_size,
            autocast_dtype=getattr(ctx, "autocast_dtype", None),
        )

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if self.accuracy_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: ConsistencyBonus.accuracy_term={self.accuracy_term!r} "
                f"is not a reward term (terms: {batch.reward_names})"
            )
        acc = batch.term(self.accuracy_term)
        raw = self.confidence(batch, ctx).to(acc.device)
        out = care_bonus(
            acc,
            raw,
            batch.group_ids,
            coef=self.coef,
            accuracy_floor=self.accuracy_floor,
            confidence_cap=self.confidence_cap,
            margin=self.margin,
            scope=self.scope,
        )
        append_reward_column(batch, self.name, out["bonus"])
        batch.extras["care_confidence"] = raw
        batch.extras["care_accurate"] = out["accurate"]
        batch.extras["care_consistent"] = out["consistent"]
        measured = out["accurate"] & ~torch.isnan(out["confidence"])
        unit = torch.zeros_like(batch.group_ids) if self.scope == "batch" else batch.group_ids
        first = torch.ones_like(unit, dtype=torch.bool)
        first[1:] = unit[1:] != unit[:-1]
        s = batch.stats
        s["care/bonus_frac"] = float((out["bonus"] > 0).float().mean())
        s["care/bonus_mean"] = float(out["bonus"].mean())
        s["care/confidence_mean"] = _mean(raw)
        s["care/answer_parsed_frac"] = float((~torch.isnan(raw)).float().mean())
        s["care/accurate_frac"] = float(out["accurate"].float().mean())
        s["care/consistency_rate"] = float(out["consistent"].sum() / measured.sum()) if measured.any() else math.nan
        s["care/threshold_mean"] = _mean(out["threshold"][first])
        return batch


ACRE_CASES = ("correct_consistent", "correct_inconsistent", "wrong_consistent", "wrong_inconsistent")


def acre_reward(correct: torch.Tensor, consistent: torch.Tensor, table: dict[str, float]) -> torch.Tensor:
    """ACRE's consistency-verification reward per row from its correctness and its option-shuffle agreement."""
    r = torch.empty(correct.shape, dtype=torch.float32)
    r[correct & consistent] = table["correct_consistent"]
    r[correct & ~consistent] = table["correct_inconsistent"]
    r[~correct & consistent] = table["wrong_consistent"]
    r[~correct & ~consistent] = table["wrong_inconsistent"]
    return r


@GROUP_STAGES.register
class ShuffleConsistencyReward:
    """ACRE ("Answer-Consistent Chain-of-thought Reinforcement Learning for Multi-modal Large Language Models",
    Huang et al., 2025): each multiple-choice completion is re-asked with its options shuffled and its own reasoning
    (``rlexp.rewards.option_shuffle``), the model (``judge``: the policy, as the paper, or the frozen reference)
    finishing greedily; the accuracy term's contribution is replaced by a reward from (correct, same option after the
    shuffle) — ``table``, highest only when both hold. The paper states only that ordering, not the values: the
    defaults are ours. With ``replace_accuracy=false`` the table is added to the reward instead (GeoReason's logical
    consistency reward: a penalty for an answer that drifts under option permutation). Appended as reward column
    ``name``; stats ``acre/consistent_frac`` (agreement over the
    measured rows), ``acre/correct_consistent_frac``, ``acre/reward_mean``."""

    def __init__(
        self,
        accuracy_term: str = "accuracy",
        table: dict | None = None,
        correct_min: float = 1.0,
        judge: str = "policy",
        max_new_tokens: int = 16,
        batch_size: int = 16,
        name: str = "acre",
        replace_accuracy: bool = True,
    ):
        table = dict(
            table
            or {
                "correct_consistent": 1.0,
                "correct_inconsistent": 0.5,
                "wrong_consistent": 0.0,
                "wrong_inconsistent": 0.0,
            }
        )
        if set(table) != set(ACRE_CASES):
            raise ValueError(
                f"algorithm.group_stages: ShuffleConsistencyReward.table keys {sorted(table)} "
                f"must be {list(ACRE_CASES)}"
            )
        if table["correct_consistent"] < max(v for k, v in table.items() if k != "correct_consistent"):
            raise ValueError(
                "algorithm.group_stages: ShuffleConsistencyReward.table: correct_consistent must be the highest reward"
            )
        if judge not in ("policy", "reference"):
            raise ValueError(
                f"algorithm.group_stages: ShuffleConsistencyReward.judge={judge!r} is not policy or reference"
            )
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(
                "algorithm.group_stages: ShuffleConsistencyReward.max_new_tokens and batch_size must be >= 1"
            )
        self.accuracy_term, self.table, self.correct_min = (
            accuracy_term,
            {k: float(v) for k, v in table.items()},
            correct_min,
        )
        self.judge, self.max_new_tokens, self.batch_size, self.name = judge, max_new_tokens, batch_size, name
        self.replace_accuracy = replace_accuracy

    def _generate(self, ctx, texts: list[str]) -> list[str]:
        model = ctx.policy if self.judge == "policy" else getattr(ctx.reference, "model", None)
        if model is None:
            raise RuntimeError(
                f"ShuffleConsistencyReward.judge={self.judge}: no model to re-ask"
                + (" (algorithm.reference.kind must be frozen or ema)" if self.judge == "reference" else "")
            )
        out: list[str] = []
        for k in range(0, len(texts), self.batch_size):
            chunk = texts[k : k + self.batch_size]
            out.extend(
                ctx.rollout.generate(
                    model, ctx.tokenizer, chunk, 1, greedy=True, max_new_tokens=self.max_new_tokens
                ).texts
            )
        return out

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        from rlexp.rewards.answers import extract_answer
        from rlexp.rewards.option_shuffle import shuffle_recheck

        if self.accuracy_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: ShuffleConsistencyReward.accuracy_term={self.accuracy_term!r} "
                f"is not a reward term (terms: {batch.reward_names})"
            )
        checks = shuffle_recheck(
            batch.prompts,
            batch.completions,
            batch.records,
            ctx.answer_format,
            lambda text: extract_answer(text, ctx.answer_format),
            lambda texts: self._generate(ctx, texts),
        )
        missing = [i for i, c in enumerate(checks) if c is None]
        if missing:
            raise ValueError(
                f"ShuffleConsistencyReward (ACRE) needs multiple-choice records (metadata.options); record "
                f"{batch.records[missing[0]].get('id')!r} has none: train with view=multiple_choice or a "
                "multiple-choice dataset"
            )
        j = batch.reward_names.index(self.accuracy_term)
        acc = batch.rewards[:, j]
        correct = (acc >= self.correct_min).cpu()
        consistent = torch.tensor([c.consistent for c in checks])
        reward = acre_reward(correct, consistent, self.table)
        w = float(batch.reward_weights[j])
        if self.replace_accuracy:  # ACRE: the reward takes the accuracy term's place
            batch.reward = batch.reward - w * acc
            batch.reward_weights = batch.reward_weights.clone()
            batch.reward_weights[j] = 0.0
        append_reward_column(batch, self.name, reward, weight=w if self.replace_accuracy else 1.0)
        s = batch.stats
        s["acre/consistent_frac"] = float(consistent.float().mean())
        s["acre/correct_consistent_frac"] = float((correct & consistent).float().mean())
        s["acre/reward_mean"] = float(reward.mean())
        return batch
