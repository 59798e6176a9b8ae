"""Pairwise preferences within a group, and the pairs the preference losses train on (issue 24's online pairwise
family: SPO's win rate, P3O, CPL, DNO, EGPO, TRPA).

A group of G completions of one prompt is compared pair by pair. ``PairwisePreference`` writes, per row i, the row
``P[i, k]`` = P(y_i ≻ y_k) against the k-th completion of its group (``batch.extras["preference"]``, (N, W), W the
largest group; NaN on the diagonal and past the group's end), and the pairs a loss uses
(``batch.extras["pairs"]``, (N, W): +1 where (i beats k) is a chosen pair, −1 where (k beats i) is, 0 elsewhere).
Both are per-row, so micro-batches and mini-batches of whole groups keep them; the column index is the row's
position within its group, so this stage runs after every stage that drops or adds rows.

The judge today is a rule on the step's own rewards (the issue's "correct beats incorrect, and shorter beats longer
among correct"): the higher total reward wins; equal rewards tie unless ``shorter_wins_from`` is set, in which case
among equal rewards of at least that value the shorter completion wins (equal lengths tie). A tie is P = 1/2 and is
never a pair; a group with one distinct reward has no pair. Pairs: ``all`` (every non-tied pair), ``sampled`` (``k``
of them per group, drawn without replacement with the stage's seed and the step), ``disjoint`` (a random perfect
matching of the group, G/2 pairs of two samples each as P3O's and EGPO's pairs; an odd group leaves one completion
out; tied matches are no pair), or ``best_worst`` (the completion with the highest win rate against the one with the
lowest, as DNO's batched on-policy pairs; none when they tie).

With ``judge="model"`` a generative pairwise judge (``rlexp.rewards.judges.PairwiseJudge``; ``judge_model``:
``initial`` — a frozen copy of the policy at the stage's first call —, ``policy`` — the live policy — or a ``model/``
config; ``judge_options``: the judge's settings, e.g. ``max_new_tokens``, ``swap``, ``template``) fills P[i, k] for
every pair of the group (``model_preference``), NaN where its verdict does not parse (no pair, not in the win rate).
It logs ``pref/judge_failures`` (pairs without a verdict), ``pref/judge_replies`` (judge generations) and
``pref/judge_rule_agreement`` (of the judged pairs, the share on which it sides with the rule judge on the step's
rewards: same winner, or both a tie; absent when no pair was judged).
"""

from __future__ import annotations

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES

PREFERENCE = "preference"
PAIRS = "pairs"
PAIR_MODES = ("all", "sampled", "disjoint", "best_worst")


def group_positions(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(N,) each row's position within its group, (N,) the index of its group's first row, and W, the largest group.
    Rows of a group must be contiguous (``RolloutBatch.group_ids``)."""
    n = group_ids.numel()
    if n == 0:
        return group_ids.new_zeros(0), group_ids.new_zeros(0), 0
    change = torch.ones(n, dtype=torch.bool, device=group_ids.device)
    change[1:] = group_ids[1:] != group_ids[:-1]
    starts = torch.nonzero(change).flatten()
    if torch.unique(group_ids).numel() != starts.numel():
        raise ValueError("pairwise preference: the rows of a group must be contiguous")
    sizes = torch.diff(torch.cat([starts, starts.new_tensor([n])]))
    start_of_row = torch.repeat_interleave(starts, sizes)
    pos = torch.arange(n, device=group_ids.device) - start_of_row
    return pos, start_of_row, int(sizes.max())


def peer_matrix(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, W) ``values`` of each row's group peers by position, and the (N, W) bool mask of real peers (not the row
    itself, not past its group's end)."""
    pos, start, width = group_positions(group_ids)
    n = values.numel()
    cols = torch.arange(width, device=values.device)
    idx = start[:, None] + cols[None, :]
    valid = idx < n
    valid &= group_ids[idx.clamp(max=n - 1)] == group_ids[:, None]
    peers = values[idx.clamp(max=n - 1)]
    valid &= cols[None, :] != pos[:, None]
    return peers, valid


def rule_preference(
    reward: torch.Tensor,
    lengths: torch.Tensor,
    group_ids: torch.Tensor,
    shorter_wins_from: float | None = None,
    tol: float = 1e-9,
) -> torch.Tensor:
    """(N, W) P(y_i ≻ y_k) by the rule judge: 1 if r_i > r_k, 0 if r_i < r_k; for equal rewards (within ``tol``)
    of at least ``shorter_wins_from``, 1 if y_i is shorter, 0 if longer; otherwise 1/2. NaN where k is no peer."""
    r = reward.float()
    length = lengths.float()
    r_peer, valid = peer_matrix(r, group_ids)
    len_peer, _ = peer_matrix(length, group_ids)
    p = torch.full_like(r_peer, 0.5)
    p = torch.where(r[:, None] > r_peer + tol, torch.ones_like(p), p)
    p = torch.where(r[:, None] < r_peer - tol, torch.zeros_like(p), p)
    if shorter_wins_from is not None:
        equal = (r[:, None] - r_peer).abs() <= tol
        eligible = equal & (r[:, None] >= shorter_wins_from)
        p = torch.where(eligible & (length[:, None] < len_peer), torch.ones_like(p), p)
        p = torch.where(eligible & (length[:, None] > len_peer), torch.zeros_like(p), p)
    return torch.where(valid, p, torch.full_like(p, float("nan")))


def win_rates(preference: torch.Tensor) -> torch.Tensor:
    """(N,) each row's mean preference over its peers (SPO's win rate; ties count 1/2); 1/2 without peers."""
    valid = ~torch.isnan(preference)
    count = valid.sum(-1)
    total = torch.where(valid, preference, torch.zeros_like(preference)).sum(-1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, 0.5))


def select_pairs(
    preference: torch.Tensor,
    group_ids: torch.Tensor,
    mode: str = "all",
    k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(N, W) antisymmetric pair matrix: +1 at [i, k] and −1 at [k's row, i's position] for each chosen pair (y_i
    beats its peer at position k); ties (P = 1/2) and missing judgements (NaN) are never pairs."""
    if mode not in PAIR_MODES:
        raise ValueError(f"pairwise preference: pairs={mode!r} is not one of {list(PAIR_MODES)}")
    pos, start, width = group_positions(group_ids)
    pairs = torch.zeros_like(preference)
    decided = ~torch.isnan(preference) & (preference != 0.5)
    wins = decided & (preference > 0.5)
    rates = win_rates(preference) if mode == "best_worst" else None
    for s in torch.unique(start).tolist():
        size = int((start == s).sum())
        rows = range(s, s + size)
        if mode == "best_worst":
            r = rates[s : s + size]
            best, worst = int(torch.argmax(r)), int(torch.argmin(r))
            if r[best] > r[worst] and bool(decided[s + best, worst]):
                pairs[s + best, worst], pairs[s + worst, best] = 1.0, -1.0
            continue
        candidates = [(i, j) for i in rows for j in range(size) if bool(wins[i, j])]  # (winner row, loser position)
        if mode == "disjoint":
            order = torch.randperm(size, generator=generator).tolist()
            matched = {frozenset((order[2 * m], order[2 * m + 1])) for m in range(size // 2)}
            candidates = [(i, j) for i, j in candidates if frozenset((i - s, j)) in matched]
        if mode == "sampled":
            if k is None or k < 1:
                raise ValueError("pairwise preference: pairs=sampled needs k >= 1 pairs per group")
            if len(candidates) > k:
                order = torch.randperm(len(candidates), generator=generator)[:k].tolist()
                candidates = [candidates[o] for o in sorted(order)]
        for i, j in candidates:
            pairs[i, j] = 1.0
            pairs[s + j, i - s] = -1.0
    return pairs


def model_preference(judge, batch: RolloutBatch, question_key: str = "question") -> torch.Tensor:
    """(N, W) P(y_i ≻ y_k) by a pairwise judge (``compare_many(triples) -> P or None``) over every unordered pair of
    each group, asked once: P[k, i] = 1 − P[i, k]; NaN on the diagonal, past the group's end and where the judge gave
    no verdict."""
    _, start, width = group_positions(batch.group_ids.cpu())
    pref = torch.full((len(batch), width), float("nan"))
    triples, where = [], []
    for s in torch.unique(start).tolist():
        size = int((start == s).sum())
        record = batch.records[s] if batch.records else {}
        question = str(record.get(question_key, batch.prompts[s]))
        for a in range(size):
            for b in range(a + 1, size):
                triples.append((question, batch.completions[s + a], batch.completions[s + b]))
                where.append((s, a, b))
    for (s, a, b), p in zip(where, judge.compare_many(triples) if triples else []):
        if p is not None:
            pref[s + a, b], pref[s + b, a] = float(p), 1.0 - float(p)
    return pref.to(batch.reward.device)


@GROUP_STAGES.register
class PairwisePreference:
    """Group stage: the group's pairwise preferences and chosen pairs (module doc). Logs ``pref/pairs_per_group``,
    ``pref/tie_frac`` (share of peer comparisons judged a tie) and ``pref/no_pair_group_frac``; with the model judge
    also ``pref/judge_failures`` and ``pref/judge_rule_agreement``."""

    needs_reference = False

    def __init__(
        self,
        judge: str = "reward",
        shorter_wins_from: float | None = None,
        pairs: str = "all",
        k: int | None = None,
        seed: int = 0,
        judge_model=None,
        judge_options: dict | None = None,
    ):
        self.model_judge = None
        if judge == "model":  # a generative pairwise judge (module doc); judge_model must be named
            from rlexp.rewards.judges import PairwiseJudge

            try:
                self.model_judge = PairwiseJudge(
                    judge_model, **{"seed": seed, **dict(judge_options or {})}, owner="PairwisePreference"
                )
            except (TypeError, ValueError) as e:
                raise ValueError(f"algorithm.group_stages: PairwisePreference.judge='model': {e}") from e
        elif judge != "reward":
            raise ValueError(
                f"algorithm.group_stages: PairwisePreference.judge={judge!r}: 'reward' (rule) or 'model' (a judge)"
            )
        elif judge_model is not None or judge_options:
            raise ValueError("algorithm.group_stages: PairwisePreference.judge_model/judge_options need judge='model'")
        if pairs not in PAIR_MODES:
            raise ValueError(f"algorithm.group_stages: PairwisePreference.pairs={pairs!r} is not one of {PAIR_MODES}")
        if pairs == "sampled" and (k is None or k < 1):
            raise ValueError("algorithm.group_stages: PairwisePreference.pairs=sampled needs k >= 1")
        self.judge, self.shorter_wins_from, self.pairs, self.k, self.seed = judge, shorter_wins_from, pairs, k, seed
        self._calls = 0

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if batch.reward is None:
            raise RuntimeError("PairwisePreference runs after the reward stage")
        pref = rule_preference(batch.reward, batch.lengths, batch.group_ids, self.shorter_wins_from)
        if self.model_judge is not None:
            rule = pref
            policy, tok = getattr(ctx, "policy", None), getattr(ctx, "tokenizer", None)
            self.model_judge.bind(policy, tok, getattr(ctx, "autocast_dtype", None))
            pref = model_preference(self.model_judge, batch)
            peers, judged = ~torch.isnan(rule), ~torch.isnan(pref)
            batch.stats["pref/judge_failures"] = float((peers & ~judged).sum()) / 2  # each pair fills two cells
            batch.stats["pref/judge_replies"] = self.model_judge.stats.get("asked", 0.0)
            if bool(judged.any()):
                agree = torch.sign(pref - 0.5) == torch.sign(rule - 0.5)
                batch.stats["pref/judge_rule_agreement"] = float((agree & judged).sum()) / float(judged.sum())
        step = getattr(ctx, "step", None)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + (self._calls if step is None else int(step)))
        self._calls += 1
        pairs = select_pairs(pref.cpu(), batch.group_ids.cpu(), self.pairs, self.k, gen).to(pref.device)
        batch.extras[PREFERENCE], batch.extras[PAIRS] = pref, pairs
        valid = ~torch.isnan(pref)
        groups = max(batch.num_groups, 1)
        chosen = (pairs > 0).sum(-1).float()
        _, start, _ = group_positions(batch.group_ids)
        per_group = torch.zeros(len(batch), device=pref.device).index_add_(0, start, chosen)
        firsts = torch.unique(start)
        batch.stats["pref/pairs_per_group"] = float(chosen.sum()) / groups
        batch.stats["pref/tie_frac"] = float(((pref == 0.5) & valid).sum()) / max(int(valid.sum()), 1)
        batch.stats["pref/no_pair_group_frac"] = float((per_group[firsts] == 0).float().mean()) if len(batch) else 0.0
        return batch


@GROUP_STAGES.register
class WinRate:
    """Group stage: SPO's reward ("A Minimaximalist Approach to Reinforcement Learning from Human Feedback", Swamy et
    al., 2024): each completion's share of wins against the other completions of its group under the pairwise
    preference (ties 1/2), after ``PairwisePreference``. ``replace``: the win rate becomes the total reward the
    advantage sees (the paper's reward); otherwise it is added as the reward column ``win_rate`` at ``weight``.
    Logs ``reward/win_rate/mean`` via the column and ``spo/win_rate_std`` (spread within groups)."""

    needs_reference = False

    def __init__(self, replace: bool = True, weight: float = 1.0):
        self.replace, self.weight = replace, float(weight)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        from rlexp.algorithms.group_stages.base import append_reward_column
        from rlexp.core.stats import group_stats

        pref = batch.extras.get(PREFERENCE)
        if pref is None:
            raise KeyError("algorithm.group_stages: WinRate needs PairwisePreference before it (extras['preference'])")
        rates = win_rates(pref).to(batch.reward.dtype)
        if self.replace:
            batch.reward = torch.zeros_like(batch.reward)
        batch = append_reward_column(batch, "win_rate", rates, 1.0 if self.replace else self.weight)
        _, std, _ = group_stats(rates, batch.group_ids)
        batch.stats["spo/win_rate_std"] = float(std.mean()) if len(batch) else 0.0
        return batch
