"""Pairwise-RL's anchored preference reward ("A Unified Pairwise Framework for RLHF: Bridging Generative Reward
Modeling and Policy Optimization", Xu, Zuo, Xin, Yue, Yan and Wu, 2025; arXiv 2504.04950).

A generative reward model reads the question, the policy's response and an anchor — the record's ground-truth /
reference response — and states which is better; the RL reward of a response is its preference probability against
the anchor, P(response ≻ anchor), a relative judgment instead of an absolute score that needs calibrating. Judges
favour a position, so with ``swap`` (the default) each pair is also asked as (anchor, response) and the two
readings averaged (``rlexp.rewards.judges.swap_average``): P = (P(y ≻ a) + 1 − P(a ≻ y)) / 2.

The anchor of a record is the first non-empty of ``anchor_keys`` (dotted keys reach into nested dicts: the GSM8K
loader keeps the worked solution in ``metadata.solution``; ``answer`` is the bare gold answer). A record without an
anchor, or a pair whose verdict does not parse, is a failure of the row: it scores ``failure_score`` (1/2: no
preference) and is counted in ``pairwise_rl/failures``.

Two readings of the verdict (``score_by``):

* ``logits`` (default): the probability of the verdict token itself, P(" A") / (P(" A") + P(" B")) of the judge's
  next token after the prompt and ``Verdict:`` (one forward per ordering, never unparsed; the calibrated score a
  generative RM gives — read with ``StepJudge.verdict_probabilities``);
* ``parse``: the judge writes its reply and the last ``Verdict: A | B | tie`` counts (``PairwiseJudge.compare_many``,
  with its cache; P in {0, 1/4, 1/2, 3/4, 1} with ``swap``).

``replace`` (default): the preference becomes the total reward the advantage sees (the paper's reward); otherwise it
is added as the reward column ``pairwise`` at ``weight``. The column ``pairwise`` is logged either way
(``reward/pairwise/mean``).

Metrics: ``pairwise_rl/pref_mean`` (mean P(response ≻ anchor)), ``pairwise_rl/pref_std`` (mean within-group std),
``pairwise_rl/beats_anchor_frac`` (share of rows with P > 1/2), ``pairwise_rl/failures``, ``pairwise_rl/no_anchor``,
``pairwise_rl/judge_prompts``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

log = logging.getLogger(__name__)

SCORE_BY = ("logits", "parse")
COLUMN = "pairwise"
ANCHOR_KEYS = ("metadata.solution", "solution", "reference", "answer")


def record_anchor(record: dict | None, keys: Sequence[str]) -> str | None:
    """The first non-empty value of ``keys`` in ``record`` (dotted keys go into nested dicts), as text; None if none."""
    for key in keys:
        value = record or {}
        for part in str(key).split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and str(value).strip():
            return str(value)
    return None


@GROUP_STAGES.register
class AnchorPreference:
    """Group stage: each completion's reward is P(completion ≻ anchor) from a generative pairwise judge (module doc)."""

    needs_reference = False

    def __init__(
        self,
        judge_model=None,
        score_by: str = "logits",
        anchor_keys: Sequence[str] = ANCHOR_KEYS,
        swap: bool = True,
        replace: bool = True,
        weight: float = 1.0,
        failure_score: float = 0.5,
        question_key: str = "question",
        judge_options: dict | None = None,
        good_token: str = " A",
        bad_token: str = " B",
        generate=None,
    ):
        from rlexp.rewards.judges import PairwiseJudge

        if score_by not in SCORE_BY:
            raise ValueError(f"algorithm.group_stages: AnchorPreference.score_by={score_by!r} is not one of {SCORE_BY}")
        if not 0.0 <= failure_score <= 1.0:
            raise ValueError(f"algorithm.group_stages: AnchorPreference.failure_score={failure_score} not in [0, 1]")
        if not list(anchor_keys):
            raise ValueError("algorithm.group_stages: AnchorPreference.anchor_keys is empty (e.g. [answer])")
        opts = dict(judge_options or {})
        try:
            # the parse reading (and the prompt template of both readings)
            self.judge = PairwiseJudge(judge_model, swap=swap, generate=generate, owner="AnchorPreference", **opts)
            self.reader = None
            if score_by == "logits":
                from rlexp.rewards.step_judges import StepJudge

                self.reader = StepJudge(
                    judge_model, score_by="logits", good_token=good_token, bad_token=bad_token,
                    batch_size=opts.get("batch_size", 8), system_prompt=opts.get("system_prompt"),
                    reply_prefix=opts.get("reply_prefix", "Verdict:"), device=opts.get("device", "auto"),
                )  # fmt: skip
                self.reader.backend = self.judge.backend  # one judge model (one frozen copy with judge_model=initial)
        except (TypeError, ValueError) as e:
            raise ValueError(f"algorithm.group_stages: AnchorPreference: {e}") from e
        self.score_by, self.anchor_keys, self.swap = score_by, [str(k) for k in anchor_keys], bool(swap)
        self.replace, self.weight, self.failure_score = bool(replace), float(weight), float(failure_score)
        self.question_key = question_key

    def preferences(self, triples: list[tuple[str, str, str]]) -> list[float | None]:
        """P(response ≻ anchor) for each (question, response, anchor); None where no verdict was read."""
        if not triples:
            return []
        if self.reader is None:
            return self.judge.compare_many(triples)
        from rlexp.rewards.judges import swap_average

        texts = [self.judge.prompt(q, y, a) for q, y, a in triples]
        if self.swap:
            texts += [self.judge.prompt(q, a, y) for q, y, a in triples]
        probs = self.reader.verdict_probabilities(texts)
        self.judge.stats = {"asked": float(len(texts)), "unparsed": 0.0, "cache_hits": 0.0}
        n = len(triples)
        return [swap_average(probs[j], probs[n + j]) if self.swap else probs[j] for j in range(n)]

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        from rlexp.algorithms.group_stages.base import append_reward_column
        from rlexp.core.stats import group_stats

        if batch.reward is None:
            raise RuntimeError("AnchorPreference runs after the reward stage")
        policy, tok, dtype = (getattr(ctx, k, None) for k in ("policy", "tokenizer", "autocast_dtype"))
        self.judge.bind(policy, tok, dtype)  # the logits reader shares the judge's backend
        n = len(batch)
        triples, where, no_anchor = [], [], 0
        for i in range(n):
            record = batch.records[i] if batch.records else {}
            anchor = record_anchor(record, self.anchor_keys)
            if anchor is None:
                no_anchor += 1
                continue
            question = str((record or {}).get(self.question_key, batch.prompts[i]))
            triples.append((question, batch.completions[i], anchor))
            where.append(i)
        try:
            probs = self.preferences(triples)
        except Exception as e:  # the judge failed on the batch: every row a failure, the run goes on
            log.warning("AnchorPreference's judge failed on %d pairs: %r", len(triples), e)
            probs = [None] * len(triples)
        scores = torch.full((n,), self.failure_score, dtype=torch.float32)
        failed = 0
        for i, p in zip(where, probs):
            if p is None:
                failed += 1
            else:
                scores[i] = float(p)
        if self.replace:
            batch.reward = torch.zeros_like(batch.reward)
        batch = append_reward_column(batch, COLUMN, scores, 1.0 if self.replace else self.weight)
        judged = [float(p) for p in probs if p is not None]
        _, std, _ = group_stats(scores.to(batch.reward.device, batch.reward.dtype), batch.group_ids)
        batch.stats.update(
            {
                "pairwise_rl/pref_mean": sum(judged) / len(judged) if judged else 0.0,
                "pairwise_rl/pref_std": float(std.mean()) if n else 0.0,
                "pairwise_rl/beats_anchor_frac": sum(p > 0.5 for p in judged) / len(judged) if judged else 0.0,
                "pairwise_rl/failures": float(failed + no_anchor),
                "pairwise_rl/no_anchor": float(no_anchor),
                "pairwise_rl/judge_prompts": float(self.judge.stats.get("asked", 0.0)),
            }
        )
        return batch
