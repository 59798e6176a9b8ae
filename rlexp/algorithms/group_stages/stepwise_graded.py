"""SGPO's graded negatives ("Stepwise Guided Policy Optimization: Coloring your Incorrect Reasoning in GRPO", Chen,
Li, Li, Chen and Lin, 2025; arXiv 2505.11595; first titled "Spectral Policy Optimization").

GRPO learns nothing from a group whose completions are all wrong (every reward equal: advantage 0). SGPO gives the
wrong completions of such an all-negative group graded rewards from a step-wise judge — how far each completion's
reasoning went right — so the group has reward variance and the policy moves toward the longer right prefixes. Groups
with at least one correct completion keep their rewards (plain GRPO).

Per completion of an all-negative group (every ``outcome_term`` value < ``correct_min``) with steps s_1..s_n (the
completion split by ``split``, at most ``max_steps``; a completion with more lines has its tail in the last step) and
step verdicts v_j (a step is right when v_j >= ``threshold``), the graded reward is

* ``grade: first_error`` (default): g = scale · (k − 1) / n, k the first step judged wrong (no wrong step: k = n + 1,
  g = scale): the share of the solution before its first error;
* ``grade: share``: g = scale · #{j : step j right} / n, the share of steps judged right.

With ``threshold`` a number, step j is right when v_j >= threshold (hard verdicts). With ``threshold: null`` (the
default) the step scores are read as the probabilities that the steps are right, independently, and g is the
expectation of the same quantity: first_error g = scale · (1/n) Σ_{m=1..n} Π_{j≤m} v_j (the probability that the
first m steps are all right, summed: the expected length of the right prefix over n), share g = scale · mean_j v_j.
For 0/1 verdicts both readings agree; with a judge's probabilities (score_by: logits) the soft reading separates
completions whose hard verdicts tie (e.g. one-step completions).

``scale`` < 1 keeps a graded wrong completion below a correct one (1 in the accuracy term) in the raw rewards; GRPO's
group standardisation makes the scale irrelevant to the advantage of the graded group. A completion the judge could
not score (a verdict that did not parse) keeps its reward (counted in ``sgpo/judge_failures``). The graded value
replaces the row's total reward (``batch.reward``) and is logged as the reward column ``sgpo`` at weight 0 (0 outside
graded groups), so ``reward/sgpo/mean`` shows it too.

The step verdicts come from ``process_term`` (a process reward term of the reward config, e.g. reward=judge_prm's
``prm``: its cached step scores, ``ProcessReward.step_scores``) when set, else from the stage's own
``rlexp.rewards.step_judges.StepJudge`` (``judge_model``: initial | policy | a model config; ``judge_options``: the
judge's settings, e.g. ``mode: cot``, ``score_by: parse``). Only the rows of all-negative groups are judged.

Metrics: ``sgpo/graded_groups`` (all-negative groups graded this step), ``sgpo/graded_group_frac``,
``sgpo/graded_reward_mean`` (mean graded value), ``sgpo/graded_reward_std`` (mean within-group std of the graded
values: > 0 means the judge separated the wrong completions), ``sgpo/judge_failures``, ``sgpo/steps_mean``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

log = logging.getLogger(__name__)

GRADES = ("first_error", "share")
COLUMN = "sgpo"


def graded_value(
    scores: Sequence[float], grade: str = "first_error", threshold: float | None = None, scale: float = 1.0
) -> float | None:
    """The graded reward of one wrong completion from its step scores (module doc); None without steps."""
    n = len(scores)
    if n == 0:
        return None
    if threshold is None:
        p = [min(max(float(v), 0.0), 1.0) for v in scores]
    else:
        p = [1.0 if float(v) >= threshold else 0.0 for v in scores]
    if grade == "share":
        return scale * sum(p) / n
    total, prefix = 0.0, 1.0
    for v in p:  # Σ_m Π_{j≤m} p_j: for 0/1 verdicts the number of steps before the first wrong one
        prefix *= v
        total += prefix
    return scale * total / n


def split_into_steps(text: str, split: str, max_steps: int) -> list[str]:
    """The completion's steps (``rlexp.rewards.process.split_steps``), at most ``max_steps`` (the tail joins the
    last)."""
    from rlexp.rewards.process import split_steps

    spans = split_steps(text, split)
    if not spans:
        return []
    if len(spans) > max_steps:
        spans = [*spans[: max_steps - 1], (spans[max_steps - 1][0], spans[-1][1])]
    return [text[s:e] for s, e in spans]


@GROUP_STAGES.register
class StepwiseGradedNegatives:
    """Group stage: SGPO (module doc). All-negative groups get graded rewards from a step-wise judge."""

    needs_reference = False

    def __init__(
        self,
        outcome_term: str = "accuracy",
        correct_min: float = 1.0,
        grade: str = "first_error",
        threshold: float | None = None,
        scale: float = 1.0,
        process_term: str | None = None,
        judge_model=None,
        judge_options: dict | None = None,
        split: str = "lines",
        max_steps: int = 8,
        question_key: str = "question",
        generate=None,
    ):
        if grade not in GRADES:
            raise ValueError(f"algorithm.group_stages: StepwiseGradedNegatives.grade={grade!r} is not one of {GRADES}")
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise ValueError(f"algorithm.group_stages: StepwiseGradedNegatives.threshold={threshold} must be in [0, 1]")
        if not scale > 0:
            raise ValueError(f"algorithm.group_stages: StepwiseGradedNegatives.scale={scale} must be > 0")
        if max_steps < 1:
            raise ValueError(f"algorithm.group_stages: StepwiseGradedNegatives.max_steps={max_steps} must be >= 1")
        from rlexp.rewards.process import SPLIT_MODES

        if split not in SPLIT_MODES:
            raise ValueError(f"algorithm.group_stages: StepwiseGradedNegatives.split={split!r} not in {SPLIT_MODES}")
        self.judge = None
        if process_term is None:
            from rlexp.rewards.step_judges import StepJudge

            try:
                self.judge = StepJudge(judge_model, **dict(judge_options or {}), generate=generate)
            except (TypeError, ValueError) as e:
                raise ValueError(f"algorithm.group_stages: StepwiseGradedNegatives (its step judge): {e}") from e
        elif judge_model is not None or judge_options or generate is not None:
            raise ValueError(
                "algorithm.group_stages: StepwiseGradedNegatives.process_term reads the reward config's process term: "
                "leave judge_model/judge_options unset (or process_term=null for the stage's own judge)"
            )
        self.outcome_term, self.correct_min = outcome_term, float(correct_min)
        self.grade, self.scale = grade, float(scale)
        self.threshold = None if threshold is None else float(threshold)
        self.process_term, self.split, self.max_steps = process_term, split, int(max_steps)
        self.question_key = question_key

    def step_scores(self, batch: RolloutBatch, rows: list[int], ctx) -> list[list[float] | None]:
        """The step scores of ``rows``: the process term's, or the stage's judge's (None: not scored)."""
        if self.process_term is not None:
            term = (getattr(ctx, "reward_terms", None) or {}).get(self.process_term)
            if term is None or not hasattr(term, "step_scores"):
                raise KeyError(
                    f"algorithm.group_stages: StepwiseGradedNegatives.process_term={self.process_term!r} is not a "
                    "process reward term with step scores (e.g. reward=judge_prm's prm); or process_term=null"
                )
            out = []
            for i in rows:
                scores = term.step_scores(batch.prompts[i], batch.completions[i])
                out.append(None if scores is None else list(scores))
            return out
        self.judge.bind(*(getattr(ctx, k, None) for k in ("policy", "tokenizer", "autocast_dtype")))
        questions, steps = [], []
        for i in rows:
            record = batch.records[i] if batch.records else {}
            questions.append(str((record or {}).get(self.question_key, batch.prompts[i])))
            steps.append(split_into_steps(batch.completions[i], self.split, self.max_steps))
        todo = [j for j, s in enumerate(steps) if s]
        scored: list[list[float] | None] = [None] * len(rows)
        if todo:
            try:
                got = self.judge.score_batch([questions[j] for j in todo], [steps[j] for j in todo])
            except Exception as e:  # the judge failed on the batch: every row unscored, the run goes on
                log.warning("SGPO's step judge failed on %d rows: %r", len(todo), e)
                got = [None] * len(todo)
            for j, s in zip(todo, got):
                scored[j] = s
        return scored

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        if batch.reward is None:
            raise RuntimeError("StepwiseGradedNegatives runs after the reward stage")
        if self.outcome_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: StepwiseGradedNegatives.outcome_term={self.outcome_term!r} is not a reward "
                f"term (terms: {batch.reward_names})"
            )
        n = len(batch)
        correct = (batch.term(self.outcome_term).float() >= self.correct_min).cpu()
        gids = batch.group_ids.cpu()
        groups = torch.unique(gids)
        negative = [int(g) for g in groups.tolist() if not bool(correct[gids == g].any())]
        rows = [i for i in range(n) if int(gids[i]) in set(negative)]
        scores = self.step_scores(batch, rows, ctx) if rows else []
        column = torch.zeros(n, dtype=batch.reward.dtype)
        reward = batch.reward.clone()
        graded: dict[int, list[float]] = {}
        failures, n_steps = 0, 0
        for i, s in zip(rows, scores):
            g = None if s is None else graded_value(s, self.grade, self.threshold, self.scale)
            if g is None:
                failures += 1
                continue
            n_steps += len(s)
            column[i] = g
            reward[i] = g
            graded.setdefault(int(gids[i]), []).append(g)
        batch.reward = reward
        from rlexp.algorithms.group_stages.base import append_reward_column

        batch = append_reward_column(batch, COLUMN, column, 0.0)
        values = [v for vs in graded.values() for v in vs]
        stds = [torch.tensor(vs).std().item() for vs in graded.values() if len(vs) > 1]
        batch.stats.update(
            {
                "sgpo/graded_groups": float(len(graded)),
                "sgpo/graded_group_frac": len(graded) / max(len(groups), 1),
                "sgpo/graded_reward_mean": sum(values) / len(values) if values else 0.0,
                "sgpo/graded_reward_std": sum(stds) / len(stds) if stds else 0.0,
                "sgpo/judge_failures": float(failures),
                "sgpo/steps_mean": n_steps / max(len(values), 1),
            }
        )
        return batch
