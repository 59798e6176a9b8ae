"""PROF's process-consistency filter ("Beyond Correctness: Harmonizing Process and Outcome Rewards through RL Training",
Ye et al., 2025; arXiv 2509.03403; released code: amazon-science/PROF-GRPO, ``prof_grpo_both/prof_ray_trainer.py``:
``compute_verify_step_level_score`` and ``filter_trajectories``).

The PRM does not enter the reward: it decides which completions the step trains on. Per completion i with outcome
r_i ∈ {0, 1} (``outcome_term`` >= ``correct_min``) and PRM step values v_ij (the process term's cached step scores,
``ProcessReward.step_scores``), the consistency score is

    c_i = mean_j 2·(v_ij − v̄)·(2·r_i − 1),   v̄ = the mean of every step value of the batch,

high when a correct completion has high step values or a wrong one low values; a completion with fewer than
``min_steps`` or more than ``max_steps`` steps loses ``step_count_penalty`` (the code's ``len_step_reward_coef`` = 10,
steps 2..30). In each group ``n_remove`` completions are dropped (``remove``, or ``remove_frac`` of the group; the
released runs keep 4 of 8): with Δ = #correct − #wrong, ⌊(Δ + n_remove)/2⌉ of them (at most n_remove; Python's
``round``, as the code) come from the correct completions with the lowest c — the rest, or all n_remove when that
number is ≤ 0, from the wrong ones with the lowest c (``negatives: consistency``, PROF-Both) or at random
(``negatives: random``, PROF-Correct, the safer variant with an untrustworthy PRM). The kept rows form the batch the
advantages are computed on (the code drops them before the GRPO advantage), so the group's correct/wrong balance moves
toward even. A row the PRM could not score has no step values: c = 0 and, with steps counted, the step-count penalty.
When the process term keeps no step scores (any other term), its column is the row's single step value and no
step-count penalty applies. PROF trains on the outcome reward only: the stage takes the process term out of the reward
(its column stays logged, at weight 0 in the total) unless ``blend: true`` (PROF on top of a PRM-blended reward).

Metrics: ``prof/dropped_frac`` (share of the step's completions dropped), ``prof/consistency_mean``,
``prof/consistency_correct_mean`` / ``prof/consistency_wrong_mean``, ``prof/kept_correct_frac`` (share of the kept rows
that are correct), ``prof/penalised_frac`` (rows outside the step-count range).
"""

from __future__ import annotations

import math
import random

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

NEGATIVES = ("consistency", "random")


def prof_keep(
    groups: list[int],
    correct: list[bool],
    critic: list[float],
    n_remove_of,
    negatives: str = "consistency",
    rng: random.Random | None = None,
) -> list[int]:
    """The row indices PROF keeps (in row order): per group, ``n_remove_of(group size)`` rows removed by the rule in
    the module docstring; ``critic`` is the consistency score after the step-count penalty."""
    by_group: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    drop: set[int] = set()
    for rows in by_group.values():
        n_remove = min(int(n_remove_of(len(rows))), len(rows))
        if n_remove <= 0:
            continue
        pos = [i for i in rows if correct[i]]
        neg = [i for i in rows if not correct[i]]
        n_pos = min(n_remove, round((len(pos) - len(neg) + n_remove) / 2))
        removed_pos = []
        if n_pos > 0:
            removed_pos = sorted(pos, key=lambda i: critic[i])[: min(n_pos, len(pos))]
        n_neg = min(n_remove - len(removed_pos), len(neg))
        if n_neg > 0:
            if negatives == "random":
                removed_neg = (rng or random.Random(0)).sample(neg, n_neg)
            else:
                removed_neg = sorted(neg, key=lambda i: critic[i])[:n_neg]
            drop.update(removed_neg)
        drop.update(removed_pos)
    return [i for i in range(len(groups)) if i not in drop]


@GROUP_STAGES.register
class ProcessConsistencyFilter:
    """Group stage: PROF's filter (see the module docstring). ``process_term``: the process reward term (its step
    scores, or its column); ``outcome_term``: the verifiable reward a completion is correct by."""

    needs_reference = False

    def __init__(
        self,
        process_term: str = "prm",
        outcome_term: str = "accuracy",
        correct_min: float = 1.0,
        remove: int | None = None,
        remove_frac: float = 0.5,
        min_steps: int = 2,
        max_steps: int = 30,
        step_count_penalty: float = 10.0,
        negatives: str = "consistency",
        seed: int = 0,
        blend: bool = False,
    ):
        if negatives not in NEGATIVES:
            raise ValueError(f"ProcessConsistencyFilter.negatives={negatives!r} is not one of {list(NEGATIVES)}")
        if remove is not None and remove < 0:
            raise ValueError(f"ProcessConsistencyFilter.remove={remove} must be >= 0 (or null: remove_frac)")
        if not 0.0 <= remove_frac < 1.0:
            raise ValueError(f"ProcessConsistencyFilter.remove_frac={remove_frac} must be in [0, 1)")
        if min_steps < 0 or max_steps < min_steps:
            raise ValueError(f"ProcessConsistencyFilter: need 0 <= min_steps ({min_steps}) <= max_steps ({max_steps})")
        self.process_term, self.outcome_term, self.correct_min = process_term, outcome_term, float(correct_min)
        self.remove, self.remove_frac = remove, float(remove_frac)
        self.min_steps, self.max_steps, self.penalty = int(min_steps), int(max_steps), float(step_count_penalty)
        self.negatives, self.seed, self.blend = negatives, int(seed), bool(blend)

    def n_remove(self, size: int) -> int:
        if self.remove is not None:
            return int(self.remove)
        return int(math.floor(self.remove_frac * size + 0.5))

    def step_values(self, batch: RolloutBatch, ctx) -> tuple[list[list[float]], bool]:
        """Each row's PRM step values and whether they are real steps (False: the term's column, one per row)."""
        term = (getattr(ctx, "reward_terms", None) or {}).get(self.process_term)
        if term is not None and hasattr(term, "step_scores"):
            return [list(term.step_scores(p, c) or []) for p, c in zip(batch.prompts, batch.completions)], True
        return [[v] for v in batch.term(self.process_term).float().tolist()], False

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        for key, name in (("process_term", self.process_term), ("outcome_term", self.outcome_term)):
            if name not in batch.reward_names:
                raise KeyError(
                    f"algorithm.group_stages: ProcessConsistencyFilter.{key}={name!r} is not a reward term (terms: "
                    f"{batch.reward_names}); PROF filters by a process reward and a verifiable outcome: "
                    "reward=accuracy_prm (a PRM in reward.terms.prm.model)"
                )
        j = batch.reward_names.index(self.process_term)
        w = float(batch.reward_weights[j]) if batch.reward_weights is not None else 0.0
        if not self.blend and w != 0.0:  # PROF trains on the outcome only: the process term leaves the reward
            batch.reward = batch.reward - w * batch.rewards[:, j]
            batch.reward_weights = batch.reward_weights.clone()
            batch.reward_weights[j] = 0.0
        n = len(batch)
        if n == 0:
            batch.stats["prof/dropped_frac"] = 0.0
            return batch
        correct = (batch.term(self.outcome_term).float() >= self.correct_min).tolist()
        steps, counted = self.step_values(batch, ctx)
        flat = [v for row in steps for v in row]
        mean_v = sum(flat) / len(flat) if flat else 0.0
        consistency, critic, penalised = [], [], 0
        for row, ok in zip(steps, correct):
            sign = 1.0 if ok else -1.0
            c = sum(2.0 * (v - mean_v) * sign for v in row) / len(row) if row else 0.0
            consistency.append(c)
            off = counted and not self.min_steps <= len(row) <= self.max_steps
            penalised += off
            critic.append(c - self.penalty * off)
        rng = random.Random(self.seed * 1_000_003 + int(getattr(ctx, "step", 0) or 0))
        keep = prof_keep(batch.group_ids.tolist(), correct, critic, self.n_remove, self.negatives, rng)
        stats = dict(batch.stats)
        pos = [c for c, ok in zip(consistency, correct) if ok]
        neg = [c for c, ok in zip(consistency, correct) if not ok]
        stats.update(
            {
                "prof/dropped_frac": 1.0 - len(keep) / n,
                "prof/consistency_mean": sum(consistency) / n,
                "prof/consistency_correct_mean": sum(pos) / len(pos) if pos else 0.0,
                "prof/consistency_wrong_mean": sum(neg) / len(neg) if neg else 0.0,
                "prof/kept_correct_frac": sum(correct[i] for i in keep) / len(keep) if keep else 0.0,
                "prof/penalised_frac": penalised / n,
            }
        )
        out = batch if len(keep) == n else batch.select(torch.tensor(keep, dtype=torch.long))
        out.stats = stats
        return out
