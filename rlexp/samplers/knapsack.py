"""Knapsack RL's exploration-budget allocation ("Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget
Allocation", Li et al., 2025, arXiv 2509.25849), in units of one group of G completions.

Each prompt is a knapsack item: given N rollouts it is worth

    Value(p, N) = (1 − p^N − (1 − p)^N) · p·(1 − p)²

— the probability that its N rollouts are neither all right nor all wrong (so GRPO's gradient is not zero) times the
paper's InfoGain approximation p(1 − p)² — with p its success rate; it costs N. A step's budget is spread over its
prompts to maximise the total value (dynamic programming), so prompts always solved (p = 1) or never (p = 0), worth
0, give theirs to the uncertain ones. The released allocation code adds a fallback: once each uncertain prompt has
the rollouts that show both outcomes with probability α (N ≥ ln(1 − α) / ln max(p, 1 − p), α = 0.9) the rest of the
budget goes to the prompts never solved (else to the other prompts without an estimate or with p = 1) — the hard
prompts get the large budgets the paper reports.

Here the trainer samples G completions per record, so the unit is one group: ``next_batch`` draws the next
``batch_size`` prompts of the seeded order (every prompt once per epoch, as ``PromptSampler``), estimates each p
from the prompt's last visit (``difficulty``; the paper's previous epoch), allocates ``batch_size`` units of G
rollouts over them (``allocate``) and returns ``batch_size`` records in which a prompt given k units appears k times,
adjacent (each copy carries ``knapsack_units: k``). A prompt given no units sits this epoch out. The group stage
``rlexp.algorithms.group_stages.budget_groups.merge_allocated_groups`` then makes each prompt's k·G rows one group,
so its advantage is normalised over all of them. This is the only sampler whose batches repeat a record.

Metrics (the last allocation): ``knapsack/units_max``, ``knapsack/prompts`` (distinct prompts), ``knapsack/value``
(Σ Value(p, k·G) over the prompts with an estimate), ``knapsack/fallback_units``, ``knapsack/idle_prompts`` (drawn,
given no units), ``knapsack/uncertain_prompts`` (0 < p < 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlexp.core.registry import SAMPLERS
from rlexp.samplers.feedback import GroupFeedback, record_key
from rlexp.samplers.shuffle import PromptSampler

UNITS_KEY = "knapsack_units"  # on each copy of a record the sampler returns: the units (groups of G) it was given
SOLVERS = ("dp", "greedy")


def task_value(p: float, n: int) -> float:
    """The paper's value of giving a prompt of success rate ``p`` ``n`` rollouts: P(non-zero gradient) · InfoGain."""
    if not 0.0 < p < 1.0 or n <= 0:
        return 0.0
    return (1.0 - p**n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def rollouts_needed(p: float, alpha: float) -> float:
    """Rollouts after which a prompt of success rate ``p`` (0 < p < 1) has shown both outcomes with probability about
    ``alpha``: ln(1 − α) / ln max(p, 1 − p) (the released code's 'probability' cost)."""
    return math.log(1.0 - alpha) / math.log(max(p, 1.0 - p))


@dataclass
class Allocation:
    units: list[int]  # per prompt of the pool
    value: float  # Σ task_value(p, units·G) over the prompts with an estimate
    fallback_units: int = 0  # units handed out by the fallback
    needed: list[int] = field(default_factory=list)  # per prompt: the units its α-confidence asks for (0: none)


def allocate(
    rates: list[float | None],
    budget: int,
    group_size: int,
    min_units: int = 1,
    max_units: int = 4,
    degenerate_units: int = 0,
    unseen_units: int = 1,
    alpha: float = 0.9,
    fallback: bool = True,
    solver: str = "dp",
) -> Allocation:
    """Spread ``budget`` units (groups of ``group_size`` rollouts) over prompts of success rates ``rates`` (None: no
    estimate yet). Prompts without an estimate get ``unseen_units``, those with p ∈ {0, 1} ``degenerate_units``; the
    others (0 < p < 1) get between ``min_units`` and ``max_units`` each, chosen to maximise Σ Value(p, k·G) — by
    dynamic programming over (prompt, units spent), or greedily by marginal gain (the same optimum: Value is concave
    in N). With ``fallback``, the uncertain prompts get only the units their α-confidence needs (at least
    ``min_units``) when those fit in the budget, and the rest goes round-robin, up to ``max_units`` each, to the
    prompts with p = 0, then to the other prompts outside the knapsack, then to the uncertain ones. Exactly
    ``budget`` units are given out; each fixed minimum must be at most 1 and ``budget`` ≥ the prompts (the pool has
    as many prompts as the budget has units)."""
    n = len(rates)
    if n > budget or max(min_units, degenerate_units, unseen_units) > 1 or n * max_units < budget:
        raise ValueError(f"cannot allocate {budget} units over {n} prompts at most {max_units} each")
    units = [0] * n
    uncertain = [i for i, p in enumerate(rates) if p is not None and 0.0 < p < 1.0]
    knapsack_items = set(uncertain)
    for i, p in enumerate(rates):
        if p is None:
            units[i] = unseen_units
        elif i not in knapsack_items:
            units[i] = degenerate_units
    room = budget - sum(units)  # for the knapsack, then the fallback
    needed = [0] * n
    for i in uncertain:
        needed[i] = min(max(math.ceil(rollouts_needed(rates[i], alpha) / group_size - 1e-9), min_units), max_units)
    knapsack = min(room, len(uncertain) * max_units)
    if fallback and sum(needed) < knapsack:
        knapsack = sum(needed)
    solve = _solve_dp if solver == "dp" else _solve_greedy
    for i, k in zip(uncertain, solve([rates[i] for i in uncertain], knapsack, group_size, min_units, max_units)):
        units[i] = k
    spare = fallback_units = budget - sum(units)
    zero = [i for i, p in enumerate(rates) if p == 0.0]
    outside = [i for i in range(n) if i not in knapsack_items and rates[i] != 0.0]
    for order in (zero, outside, uncertain):
        while spare and order and any(units[i] < max_units for i in order):
            for i in order:
                if spare and units[i] < max_units:
                    units[i] += 1
                    spare -= 1
    value = sum(task_value(p, k * group_size) for p, k in zip(rates, units) if p is not None)
    return Allocation(units, value, fallback_units, needed)


def _solve_dp(rates: list[float], budget: int, g: int, lo: int, hi: int) -> list[int]:
    """Units per prompt, each in [lo, hi], summing to ``budget`` (feasible: n·lo ≤ budget ≤ n·hi), maximising
    Σ Value(p, k·g). best[w]: the best value of the prompts so far with w units; on ties the later prompt keeps
    the fewer units (as the greedy solver, which favours the earlier prompt)."""
    n = len(rates)
    if n == 0:
        return []
    neg = float("-inf")
    best = [0.0] + [neg] * budget
    choices: list[list[int]] = []
    for i, p in enumerate(rates):
        values = {k: task_value(p, k * g) for k in range(lo, hi + 1)}
        nxt, pick = [neg] * (budget + 1), [-1] * (budget + 1)
        for w in range(i * lo + lo, min(budget, (i + 1) * hi) + 1):  # the totals the first i + 1 prompts can reach
            for k, v in values.items():
                if k <= w and best[w - k] != neg and best[w - k] + v > nxt[w] + 1e-15:
                    nxt[w], pick[w] = best[w - k] + v, k
        best = nxt
        choices.append(pick)
    out, w = [0] * n, budget
    for i in range(n - 1, -1, -1):
        out[i] = choices[i][w]
        w -= out[i]
    return out


def _solve_greedy(rates: list[float], budget: int, g: int, lo: int, hi: int) -> list[int]:
    """The same optimum by marginal gains: every prompt starts at ``lo``; each further unit goes to the prompt whose
    value grows most (the earliest on ties)."""
    out = [lo] * len(rates)
    for _ in range(budget - lo * len(rates)):
        gains = [
            task_value(p, (k + 1) * g) - task_value(p, k * g) if k < hi else float("-inf") for p, k in zip(rates, out)
        ]
        out[max(range(len(out)), key=lambda i: (gains[i], -i))] += 1
    return out


@SAMPLERS.register
class KnapsackSampler(PromptSampler):
    """The shuffled order of ``PromptSampler``, its ``batch_size`` prompts a step given ``batch_size`` units of
    ``group_size`` rollouts by Knapsack RL's allocation (``allocate``); a prompt with k units appears k times,
    adjacent. ``group_size`` is the trainer's G (the config interpolates ``trainer.num_generations``)."""

    def __init__(
        self,
        records: list[dict],
        batch_size: int,
        seed: int,
        difficulty_window: int = 1,
        group_size: int = 8,
        min_units: int = 1,
        max_units: int = 4,
        degenerate_units: int = 0,
        unseen_units: int = 1,
        alpha: float = 0.9,
        fallback: bool = True,
        solver: str = "dp",
    ):
        from rlexp.config.schema import ConfigError

        if group_size < 1:
            raise ConfigError(f"sampler.group_size={group_size} must be ≥ 1 (trainer.num_generations)")
        if max_units < 1:
            raise ConfigError(f"sampler.max_units={max_units} must be ≥ 1")
        for name, value in (
            ("min_units", min_units),
            ("degenerate_units", degenerate_units),
            ("unseen_units", unseen_units),
        ):
            if value not in (0, 1):
                raise ConfigError(
                    f"sampler.{name}={value} must be 0 or 1: a step draws as many prompts as it has units, so no "
                    "prompt can be promised more than one"
                )
        if not 0.0 < alpha < 1.0:
            raise ConfigError(f"sampler.alpha={alpha} must be in (0, 1)")
        if solver not in SOLVERS:
            raise ConfigError(f"sampler.solver={solver!r} is not one of {list(SOLVERS)}")
        super().__init__(records, batch_size, seed, difficulty_window)
        self.group_size, self.min_units, self.max_units = group_size, min_units, max_units
        self.degenerate_units, self.unseen_units = degenerate_units, unseen_units
        self.alpha, self.fallback, self.solver = alpha, fallback, solver
        self.last: dict[str, float] = {}

    def next_batch(self) -> list[dict]:
        pool = super().next_batch()  # the next batch_size prompts of the order, each once
        rates = [self.difficulty.pass_rate(record_key(r)) for r in pool]
        a = allocate(
            rates,
            len(pool),
            self.group_size,
            self.min_units,
            self.max_units,
            self.degenerate_units,
            self.unseen_units,
            self.alpha,
            self.fallback,
            self.solver,
        )
        out = []
        for record, k in zip(pool, a.units):
            if k:
                copy = {**record, UNITS_KEY: k}
                out += [copy] * k
        self.last = {
            "knapsack/units_max": float(max(a.units)),
            "knapsack/prompts": float(sum(k > 0 for k in a.units)),
            "knapsack/value": a.value,
            "knapsack/fallback_units": float(a.fallback_units),
            "knapsack/idle_prompts": float(sum(k == 0 for k in a.units)),
            "knapsack/uncertain_prompts": float(sum(p is not None and 0.0 < p < 1.0 for p in rates)),
        }
        return out

    def observe(self, feedback: GroupFeedback) -> None:
        """The step's groups (one per unit), pooled per prompt first: a prompt of k units adds one pass rate, that of
        its k·G completions (the mean of its groups' rates, all of G completions)."""
        pooled: dict[str, list] = {}
        solved = feedback.all_correct or [False] * len(feedback.records)
        for record, rate, done in zip(feedback.records, feedback.pass_rate, solved):
            entry = pooled.setdefault(record_key(record), [record, [], True])
            entry[1].append(rate)
            entry[2] = entry[2] and done
        super().observe(
            GroupFeedback(
                [e[0] for e in pooled.values()],
                [sum(e[1]) / len(e[1]) for e in pooled.values()],  # NaN stays NaN
                [e[2] for e in pooled.values()],
            )
        )

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), **self.last}
