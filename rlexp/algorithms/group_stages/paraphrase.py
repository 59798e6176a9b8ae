"""Rewards over a paraphrase set: how the completions of one wording of a question agree with those of the others
(the group holds K wordings, G/K completions each: ``rlexp.algorithms.prompt_conditions.paraphrases.ParaphraseSet``).

* ``GroupSimilarity`` — PS-GRPO (Con-RAG, "Consistency in RAG with Group Similarity Rewards", 2025): each rollout's
  reward is its similarity to the rollouts of the *other* paraphrases of its query, averaged; the "scalable
  approximation" compares it with ``sample`` of them instead of all. The paper does not state the similarity; ours:
  1 for math-equivalent answers, else the SQuAD token F1 of the two answers (``compare: answer``), or the token F1
  of the whole completions (``compare: completion``, for long-form outputs); no answer: 0.
* ``AnswerStability`` — information-consistent GRPO ("Information-Consistent LM Recommendations through GRPO",
  2025): an entropy-based stability reward over a group of equivalent prompt variants. The paper names it without a
  formula; ours: a completion's reward is how much it lowers the entropy of the group's answer distribution,
  H(answers without it) − H(all answers) in nats — positive for an answer that agrees with the others, negative for
  an outlier; a completion without an answer counts as an answer of its own (an outlier).
"""

from __future__ import annotations

import collections
import math
import re
import string

import torch

from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.algorithms.group_stages.votes import cluster_answers, row_variants
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.answers import extract_answer, math_equal

COMPARES = ("answer", "completion")


def _tokens(text: str) -> list[str]:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, whitespace tokens."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def token_f1(a: str, b: str) -> float:
    """SQuAD token F1 of two texts (1 for two texts that both normalise to nothing)."""
    ta, tb = _tokens(a), _tokens(b)
    if not ta or not tb:
        return float(ta == tb)
    common = sum((collections.Counter(ta) & collections.Counter(tb)).values())
    if common == 0:
        return 0.0
    p, r = common / len(ta), common / len(tb)
    return 2 * p * r / (p + r)


def answer_similarity(a: str | None, b: str | None) -> float:
    """1 for equal or math-equivalent answers, else their token F1; 0 when either is missing."""
    if a is None or b is None:
        return 0.0
    if a == b or math_equal(a, b):
        return 1.0
    return token_f1(a, b)


def answer_entropy(ids: list[int]) -> float:
    """Entropy (nats) of the answer distribution of cluster ids; −1 (no answer) rows are singletons each."""
    if not ids:
        return 0.0
    counts = collections.Counter(j if j >= 0 else ("none", i) for i, j in enumerate(ids))
    n = len(ids)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def stability_rewards(ids: list[int]) -> list[float]:
    """Each row's H(ids without it) − H(ids) (see the module doc)."""
    full = answer_entropy(ids)
    return [answer_entropy(ids[:i] + ids[i + 1 :]) - full for i in range(len(ids))]


def _groups(batch: RolloutBatch) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


@GROUP_STAGES.register
class GroupSimilarity:
    """Group stage: PS-GRPO's group-similarity reward (see the module doc), appended as reward column ``name`` at
    ``weight``. ``sample``: how many rollouts of the other paraphrases each one is compared with (drawn without
    replacement, seeded by ``seed`` and the group; null: all of them — the exact reward).

    Logged: ``ps_grpo/similarity_mean``; ``paraphrase/answer_agreement`` — the share of cross-paraphrase pairs of
    completions with equivalent answers (the paraphrase consistency of the step)."""

    needs_reference = False

    def __init__(
        self,
        name: str = "group_similarity",
        weight: float = 1.0,
        compare: str = "answer",
        sample: int | None = None,
        seed: int = 0,
        fallback_last_number: bool = True,
    ):
        if compare not in COMPARES:
            raise ValueError(f"algorithm.group_stages: GroupSimilarity.compare={compare!r} is not one of {COMPARES}")
        if sample is not None and int(sample) < 1:
            raise ValueError(f"algorithm.group_stages: GroupSimilarity.sample={sample} must be >= 1 or null (all)")
        self.name, self.weight, self.compare = name, float(weight), compare
        self.sample, self.seed, self.fallback = None if sample is None else int(sample), int(seed), fallback_last_number

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        variants = row_variants(batch, "GroupSimilarity")
        fmt = getattr(ctx, "answer_format", "hash")
        answers = [extract_answer(c, fmt, fallback_last_number=self.fallback) for c in batch.completions]
        scores = torch.zeros(len(batch))
        pairs_equal, pairs = 0, 0
        for rows in _groups(batch):
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(batch.group_ids[rows[0]]))
            for i in rows:
                others = [j for j in rows if variants[j] != variants[i]]
                if self.sample is not None and len(others) > self.sample:
                    others = [others[k] for k in torch.randperm(len(others), generator=gen)[: self.sample].tolist()]
                if not others:
                    continue
                if self.compare == "answer":
                    sims = [answer_similarity(answers[i], answers[j]) for j in others]
                else:
                    sims = [token_f1(batch.completions[i], batch.completions[j]) for j in others]
                scores[i] = sum(sims) / len(sims)
            for a in rows:  # the consistency metric: every cross-paraphrase pair, once
                for b in rows:
                    if a < b and variants[a] != variants[b]:
                        pairs += 1
                        pairs_equal += answer_similarity(answers[a], answers[b]) == 1.0
        append_reward_column(batch, self.name, scores, self.weight)
        batch.stats["ps_grpo/similarity_mean"] = float(scores.mean()) if len(batch) else math.nan
        batch.stats["paraphrase/answer_agreement"] = pairs_equal / pairs if pairs else math.nan
        return batch


@GROUP_STAGES.register
class AnswerStability:
    """Group stage: information-consistent GRPO's entropy-based stability reward (see the module doc), appended as
    reward column ``name`` at ``weight``. Needs the group's prompt variants (``ParaphraseSet``) so that stability is
    measured across wordings.

    Logged: ``info_consistent/answer_entropy_mean`` (nats, over the groups), ``info_consistent/stability_mean``,
    ``info_consistent/stable_group_frac`` (groups whose every completion gives the same answer)."""

    needs_reference = False

    def __init__(self, name: str = "stability", weight: float = 1.0, fallback_last_number: bool = True):
        self.name, self.weight, self.fallback = name, float(weight), fallback_last_number

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        row_variants(batch, "AnswerStability")
        fmt = getattr(ctx, "answer_format", "hash")
        answers = [extract_answer(c, fmt, fallback_last_number=self.fallback) for c in batch.completions]
        scores = torch.zeros(len(batch))
        entropies, stable = [], 0
        for rows in _groups(batch):
            ids = cluster_answers([answers[i] for i in rows])
            for i, r in zip(rows, stability_rewards(ids)):
                scores[i] = r
            h = answer_entropy(ids)
            entropies.append(h)
            stable += h == 0.0 and ids[0] >= 0
        append_reward_column(batch, self.name, scores, self.weight)
        s = batch.stats
        s["info_consistent/answer_entropy_mean"] = sum(entropies) / len(entropies) if entropies else math.nan
        s["info_consistent/stability_mean"] = float(scores.mean()) if len(batch) else math.nan
        s["info_consistent/stable_group_frac"] = stable / max(len(entropies), 1)
        return batch
