"""The reward stage: every term scores every sample; the weighted sum is the reward. A score that is not a finite
number (NaN, ±inf, None from a group-aware term) stops the step before any update, naming the term and the sample
(``NonFiniteRewardError``): it would otherwise poison the advantages and surface only as a non-finite gradient norm.
A sample that every term failed on (raised) or left missing (a reward function's None) is marked in
``batch.extras["unscored"]`` (N,) bool; its reward is 0 and it counts like any row (verl) unless
``algorithm.unscored_rows=exclude`` (TRL: out of the group statistics, advantage 0). A term that places rewards at
token positions (``TermResult.token_rewards``: a dense process reward) fills ``batch.extras["token_rewards"]``."""

from __future__ import annotations

import math

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_REWARDS, UNSCORED
from rlexp.rewards.terms import RewardTerm, Sample


def samples_of(batch: RolloutBatch) -> list[Sample]:
    lengths = batch.lengths.tolist()
    ids = batch.completion_ids.tolist()
    return [
        Sample(
            batch.prompts[i],
            batch.completions[i],
            batch.records[i],
            int(batch.group_ids[i]),
            int(lengths[i]),
            bool(batch.truncated[i]),
            ids[i][: int(lengths[i])],
        )
        for i in range(len(batch))
    ]


class NonFiniteRewardError(FloatingPointError):
    """A reward term gave a sample NaN, ±inf or something that is not a number; the message names both."""


def _finite_scores(name: str, scores: list, batch: RolloutBatch) -> list[float]:
    out, bad = [], []
    for i, v in enumerate(scores):
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = math.nan
        if not math.isfinite(f):
            bad.append(i)
        out.append(f)
    if bad:
        i = bad[0]
        group = int(batch.group_ids[i])
        completion = sum(1 for j in range(i) if int(batch.group_ids[j]) == group)
        record = batch.records[i] if batch.records else {}
        question = str(record.get("question", ""))
        question = repr(question if len(question) <= 60 else question[:57] + "...")
        raise NonFiniteRewardError(
            f"reward.terms.{name} returned {scores[i]!r} for sample {i} (completion {completion} of group {group}, "
            f"record {record.get('id')!r}, question {question}); {len(bad)} of {len(scores)} samples are not finite "
            "numbers (a reward function may return None for 'does not apply', scored 0)"
        )
    return out


def score(batch: RolloutBatch, terms: dict[str, RewardTerm]) -> RolloutBatch:
    if not terms:
        raise ValueError("reward.terms is empty: configure at least one reward term")
    samples = samples_of(batch)
    cols, fails, unscored = [], [], [True] * len(samples)
    placed: dict[str, list] = {}  # terms that pay at token positions (TermResult.token_rewards)
    for name, term in terms.items():
        res = term(samples)
        if res.token_rewards is not None:
            placed[name] = res.token_rewards
        if len(res.scores) != len(samples):
            raise ValueError(f"reward term {name!r} returned {len(res.scores)} scores for {len(samples)} samples")
        cols.append(_finite_scores(name, res.scores, batch))
        fails.append(res.failures or [False] * len(samples))
        missing = res.missing or [False] * len(samples)
        unscored = [u and (f or m) for u, f, m in zip(unscored, fails[-1], missing)]
        for key, value in (res.metrics or {}).items():  # a term's own scalars (TermResult.metrics)
            batch.stats[f"reward/{name}/{key}"] = float(value)
    device = batch.completion_ids.device
    batch.rewards = torch.tensor(cols, dtype=torch.float32, device=device).T.contiguous()
    batch.reward_failures = torch.tensor(fails, dtype=torch.bool, device=device).T.contiguous()
    batch.reward_names = list(terms)
    batch.extras[UNSCORED] = torch.tensor(unscored, dtype=torch.bool, device=device)
    for name, t in terms.items():
        if not math.isfinite(t.weight):
            raise NonFiniteRewardError(f"reward.terms.{name}.weight={t.weight}: must be a finite number")
    batch.reward_weights = torch.tensor([t.weight for t in terms.values()], dtype=torch.float32, device=device)
    if placed:
        _place_token_rewards(batch, terms, placed)
    batch.reward = batch.rewards @ batch.reward_weights
    return batch


def _place_token_rewards(batch: RolloutBatch, terms: dict[str, RewardTerm], placed: dict[str, list]) -> None:
    """weight × each term's (token, reward) pairs into ``batch.extras["token_rewards"]`` (N, T); such a term pays
    through its token rewards, so its score column enters the outcome reward at weight 0 (still logged)."""
    n, width = batch.completion_ids.shape
    out = torch.zeros(n, width, dtype=torch.float32)
    names = list(terms)
    weights = batch.reward_weights.clone()
    for name, rows in placed.items():
        if len(rows) != n:
            raise ValueError(f"reward term {name!r} returned token rewards for {len(rows)} of {n} samples")
        w = float(terms[name].weight)
        for i, pairs in enumerate(rows):
            for t, r in pairs:
                if 0 <= int(t) < width:
                    out[i, int(t)] += w * float(r)
        weights[names.index(name)] = 0.0
    batch.reward_weights = weights
    batch.extras[TOKEN_REWARDS] = out.to(batch.completion_ids.device)
