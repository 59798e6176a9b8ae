"""Guidance for groups the policy cannot solve: GHPO's hinted retries — "GHPO: Adaptive Guidance for Stable and
Efficient LLM Reinforcement Learning" (Guided Hybrid Policy Optimization, 2025; arXiv 2507.10628).

After scoring, a group whose accuracy term is ≤ 0 on every completion is too hard for the policy as it stands: its
rewards do not vary, so plain GRPO learns nothing from it. GHPO then asks again with part of the reference solution
in the prompt — the question, a fixed sentence, and the first ω of the solution — and rolls out a fresh group of G
completions; while a group stays all-wrong, ω grows (0.25, 0.5, 0.75 in the released code). The group's rows are
replaced by the last hinted group, and the update conditions on the hinted prompt (the rows' prompt ids and text are
the hinted prompt's), so a group that becomes solvable with a hint gives the policy an imitation-like signal towards
the reference reasoning; a group still all-wrong at the last ω keeps its (zero-advantage) hinted rows.

Where a record's hint comes from (``rlexp.data.demonstrations``): the dataset's ``demonstration`` column when it has
one (``dataset.demonstration_column``), else ``reasoning(record)`` (reasoning-gym's ``answer_cot``, GSM8K/MATH's
``solution`` without its answer line, or the arithmetic tasks' ``<expression> = <answer>``); the share is cut at a
word boundary (``prefix``). A record with no solution is left as it is and counted (``ghpo/missing_solution``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_REWARDS, UNSCORED
from rlexp.core.registry import GROUP_STAGES
from rlexp.data.demonstrations import prefix, reasoning

# GHPO's hint sentence (hkgc-1/GHPO, src/ghpo/ghpo_trainer.py, ``_generate_and_score_completions``): appended to the
# user's question, followed by the share of the solution (the released string starts "\n " — the stray space is
# dropped here)
HINT_TEMPLATE = (
    "{question}\nThe following text is the beginning part of the answer, which you can refer to for solving the "
    "problem:\n{hint}"
)
GHPO_FRACTIONS = (0.25, 0.5, 0.75)
# the per-row extras the reward stage itself writes: the hinted rows are scored by the same terms, so they have them
_SCORING_EXTRAS = {UNSCORED, TOKEN_REWARDS}


def hint_source(record: dict) -> str | None:
    """The text a record's hints are cut from: its ``demonstration`` column as written, else its worked reasoning
    (``rlexp.data.demonstrations.reasoning``); None when it has neither."""
    given = record.get("demonstration")
    if isinstance(given, str) and given.strip():
        return given.strip()
    return reasoning(record)


def hinted_question(question: str, solution: str, fraction: float, template: str = HINT_TEMPLATE) -> str:
    """``question`` with the first ``fraction`` of ``solution`` (whole words) as a hint, in ``template``."""
    return template.format(question=question, hint=prefix(solution, fraction))


def all_wrong_groups(accuracy: torch.Tensor, group_ids: torch.Tensor) -> list[int]:
    """The group ids (in batch order) whose every row has accuracy ≤ 0 (GHPO's test on its accuracy reward)."""
    out = []
    for g in torch.unique_consecutive(group_ids).tolist():
        if bool((accuracy[group_ids == g] <= 0).all()):
            out.append(int(g))
    return out


@GROUP_STAGES.register
class HintedRetry:
    """GHPO's adaptive guidance: all-wrong groups are rolled out again with a growing share of the reference
    solution in the prompt, and their rows replaced by the hinted group.

    ``accuracy_term``: the reward term that decides "all wrong" (≤ 0 on every completion; the trainer's accuracy
    term). ``fractions``: the hint shares ω tried in order, one retry round each, while the group stays all-wrong
    (GHPO: 0.25, 0.5, 0.75). ``template``: the hinted question, with ``{question}`` and ``{hint}``. ``start_step``:
    steps trained without hints first (GHPO's ``start_hint_step``; 0: hints from the first step). The hinted question
    is rendered with the run's prompt format (``ctx.prompt_format``), so ``trainer.max_prompt_length`` fits it as any
    prompt (its start cut when too long, like GHPO's left truncation at ``max_prompt_length``).

    Metrics: ``ghpo/hinted_groups`` (groups whose rows were replaced), ``ghpo/hint_fraction_mean`` (their final ω),
    ``ghpo/hinted_accuracy`` (accuracy of the hinted rows that train), ``ghpo/solved_with_hint`` (hinted groups with a
    correct completion), ``ghpo/missing_solution`` (all-wrong groups whose record has no solution, left as they
    are), ``ghpo/all_wrong_groups``, ``ghpo/retries`` (retry rounds run), ``ghpo/accuracy_before_hints`` (the step's
    accuracy before any replacement; the step's ``reward/*`` metrics include the hinted rows, as GHPO logs them),
    ``time/ghpo_generate_s``. The retries' scoring time goes to ``time/reward_s`` (as the DAPO refill's does)."""

    needs_reference = False

    def __init__(
        self,
        accuracy_term: str = "accuracy",
        fractions: Sequence[float] = GHPO_FRACTIONS,
        template: str = HINT_TEMPLATE,
        start_step: int = 0,
    ):
        fractions = [float(f) for f in fractions]
        if not fractions:
            raise ValueError("HintedRetry.fractions is empty: give the hint shares to try, e.g. [0.25, 0.5, 0.75]")
        if any(not 0.0 < f <= 1.0 for f in fractions):
            raise ValueError(f"HintedRetry.fractions={fractions}: each hint share must be in (0, 1]")
        if any(b <= a for a, b in zip(fractions, fractions[1:])):
            raise ValueError(f"HintedRetry.fractions={fractions} must increase (a retry shows more of the solution)")
        if "{question}" not in template or "{hint}" not in template:
            raise ValueError(f"HintedRetry.template={template!r} must contain {{question}} and {{hint}}")
        if start_step < 0:
            raise ValueError(f"HintedRetry.start_step={start_step} must be >= 0")
        self.accuracy_term, self.fractions, self.template = accuracy_term, fractions, template
        self.start_step = int(start_step)

    def _check(self, batch: RolloutBatch, ctx) -> None:
        missing = [
            n for n in ("rollout", "reward_terms", "prompt_format", "tokenizer") if getattr(ctx, n, None) is None
        ]
        if missing:
            raise RuntimeError(f"HintedRetry needs the stage context's {missing} to roll out hinted prompts")
        if self.accuracy_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: HintedRetry.accuracy_term={self.accuracy_term!r} is not a reward term "
                f"(terms: {batch.reward_names})"
            )
        foreign = sorted(set(batch.extras) - _SCORING_EXTRAS)
        if foreign or list(batch.reward_names) != list(ctx.reward_terms):
            raise ValueError(
                "algorithm.group_stages: HintedRetry replaces whole groups by freshly scored ones and cannot fill "
                f"what earlier parts added to the batch (extras {foreign}, reward columns {batch.reward_names} vs "
                f"terms {list(ctx.reward_terms)}): put it first among the group stages, without "
                "algorithm.prompt_condition"
            )

    def _rollout(self, ctx, groups: list[int], questions: list[str], records: list[dict], size: int, timing: dict):
        """G=``size`` fresh completions of each hinted question, scored: one batch, group ids ``groups``."""
        from rlexp.rewards.scoring import score

        prompts = [ctx.prompt_format.render(ctx.tokenizer, q) for q in questions]
        dtype = ctx.autocast_dtype
        device = next(ctx.policy.parameters()).device
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = ctx.rollout.generate(ctx.policy, ctx.tokenizer, prompts, num_generations=size)
        t1 = time.perf_counter()
        gid = torch.tensor(groups, device=out.completion_ids.device).repeat_interleave(size)
        hinted = RolloutBatch.from_generation(
            out, gid, [p for p in prompts for _ in range(size)], [r for r in records for _ in range(size)]
        )
        score(hinted, ctx.reward_terms)
        timing["generate"] += t1 - t0
        timing["reward"] += time.perf_counter() - t1
        return hinted

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        stats = {
            "ghpo/hinted_groups": 0.0,
            "ghpo/hint_fraction_mean": 0.0,
            "ghpo/hinted_accuracy": 0.0,
            "ghpo/solved_with_hint": 0.0,
            "ghpo/missing_solution": 0.0,
            "ghpo/all_wrong_groups": 0.0,
            "ghpo/retries": 0.0,
        }
        if len(batch) == 0 or getattr(ctx, "step", 1) <= self.start_step:
            batch.stats.update(stats)
            return batch
        self._check(batch, ctx)
        gids = batch.group_ids.cpu()
        accuracy = batch.term(self.accuracy_term).detach().cpu()
        stats["ghpo/accuracy_before_hints"] = float(accuracy.float().mean())
        wrong = all_wrong_groups(accuracy, gids)
        stats["ghpo/all_wrong_groups"] = float(len(wrong))
        rows = {g: (gids == g).nonzero().squeeze(-1) for g in wrong}
        sources: dict[int, tuple[dict, str]] = {}
        for g in wrong:
            record = batch.records[int(rows[g][0])]
            text = hint_source(record)
            if text is None:
                stats["ghpo/missing_solution"] += 1
            else:
                sources[g] = (record, text)
        replaced: dict[int, RolloutBatch] = {}  # group id -> its latest hinted rows
        fraction_of: dict[int, float] = {}
        timing = {"generate": 0.0, "reward": 0.0}
        todo = list(sources)
        for fraction in self.fractions:
            if not todo:
                break
            stats["ghpo/retries"] += 1
            by_size: dict[int, list[int]] = {}  # groups of one size go out in one generate call
            for g in todo:
                by_size.setdefault(len(rows[g]), []).append(g)
            for size, groups in by_size.items():
                questions = [
                    hinted_question(sources[g][0]["question"], sources[g][1], fraction, self.template) for g in groups
                ]
                hinted = self._rollout(ctx, groups, questions, [sources[g][0] for g in groups], size, timing)
                hinted_gids = hinted.group_ids.cpu()
                for g in groups:
                    replaced[g] = hinted.select((hinted_gids == g).nonzero().squeeze(-1))
                    fraction_of[g] = fraction
            todo = [g for g in todo if bool((replaced[g].term(self.accuracy_term) <= 0).all())]
        if replaced:
            pieces = [
                replaced[g] if g in replaced else batch.select((gids == g).nonzero().squeeze(-1))
                for g in torch.unique_consecutive(gids).tolist()
            ]
            out = RolloutBatch.concat(pieces)
            out.stats = dict(batch.stats)
            batch = out
            acc = torch.cat([replaced[g].term(self.accuracy_term).cpu() for g in replaced])
            stats["ghpo/hinted_groups"] = float(len(replaced))
            stats["ghpo/hint_fraction_mean"] = sum(fraction_of.values()) / len(fraction_of)
            stats["ghpo/hinted_accuracy"] = float(acc.float().mean())
            stats["ghpo/solved_with_hint"] = float(len(replaced) - len(todo))
        batch.stats.update(stats)
        batch.stats["time/ghpo_generate_s"] = timing["generate"]
        if timing["reward"]:
            batch.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + timing["reward"]
        return batch
