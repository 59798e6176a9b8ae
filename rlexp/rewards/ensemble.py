"""Multi-reward-model voting (issue 23): "Secrets of RLHF in Large Language Models Part II: Reward Modeling"
(Wang et al., 2024, arXiv 2401.06080), its "measuring the strength of preferences": M reward models (in the paper
trained on the same preferences with different seeds and data orders) each score both answers of a pair; the
preference strength of (i, j) under model m is d_m = r_m(i) − r_m(j), and its mean μ and standard deviation σ over
the M models say how strong and how contested the preference is (a negative mean: the label is probably wrong; a
mean near 0 with a large σ: an ambiguous pair, which the paper trains on softly: label smoothing, adaptive margin).

``RewardVote`` carries the voting to online RL: each completion is scored by every model of ``models`` (a
``RewardModel`` underneath: the same loading, chat rendering, batching, normalisation and LRU cache — here the cache
keeps each pair's vector of M scores). The term's score is the ensemble mean r̄_i = mean_m r_m(i). Within a group,
every pair (i, j) is a preference the policy update will act on: its agreement is the fraction of the M models whose
own preference sign(d_m) matches the ensemble's sign(μ_ij) (a pair the ensemble ties, μ = 0, agrees fully only when
every model ties); a completion's agreement a_i is the mean over its group peers (1 without peers). ``low_agreement``:

* ``keep`` — the mean as the reward; agreement only logged;
* ``shrink`` — r_i = ḡ + a_i · (r̄_i − ḡ), ḡ the group's mean of r̄: a contested completion's distance from its group
  shrinks by its agreement (our online analogue of the paper's soft labels for weak preferences: it moves less);
* ``drop`` — completions with a_i < ``agreement_threshold`` get ḡ (no preference over their peers from the reward).

Metrics (``reward/<term>/<key>``): ``agreement`` (mean a_i), ``std_mean`` (mean over completions of the std over
models of their scores), ``strength_mean`` (mean |μ_ij| over the group pairs), ``low_agreement_frac`` (share with
a_i < ``agreement_threshold``), ``models``, ``cache_hits``, ``cache_hit_rate``, ``truncated``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from rlexp.core.registry import REWARDS
from rlexp.rewards.reward_model import LRUCache, RewardModel, pair_key, reward_model_logits
from rlexp.rewards.terms import Sample, TermResult

log = logging.getLogger(__name__)

LOW_AGREEMENT = ("keep", "shrink", "drop")


def vote_statistics(scores: torch.Tensor, groups: Sequence[int]) -> dict[str, torch.Tensor]:
    """Voting statistics of an (M models, N completions) score matrix: ``mean`` (N,) the ensemble mean, ``std`` (N,)
    the spread over models (population std, 0 with one model), ``agreement`` (N,) each completion's mean agreement
    with its group peers (module doc; 1 without peers), ``strength`` (P,) |μ| of every within-group pair."""
    m, n = scores.shape
    mean, std = scores.mean(0), scores.std(0, unbiased=False)
    g = torch.as_tensor(list(groups))
    same = (g[:, None] == g[None, :]) & ~torch.eye(n, dtype=torch.bool)
    d = scores[:, :, None] - scores[:, None, :]  # (M, N, N): d_m(i, j)
    mu = d.mean(0)
    agree = (torch.sign(d) == torch.sign(mu)[None]).float().mean(0)  # (N, N) fraction of models siding with μ
    peers = same.sum(1)
    agreement = torch.where(peers > 0, (agree * same).sum(1) / peers.clamp(min=1), torch.ones(n))
    upper = same & torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    return {"mean": mean, "std": std, "agreement": agreement, "strength": mu.abs()[upper]}


def group_means(values: torch.Tensor, groups: Sequence[int]) -> torch.Tensor:
    """Each completion's group mean of ``values``."""
    g = torch.as_tensor(list(groups))
    same = (g[:, None] == g[None, :]).float()
    return (same @ values) / same.sum(1)


@REWARDS.register
class RewardVote(RewardModel):
    """The ensemble mean of several reward models' scores, with their agreement on each group's preferences
    (module doc); ``models``: two or more hub ids / local paths / ``model/`` configs (RewardModel's settings)."""

    def __init__(
        self,
        weight: float = 1.0,
        models: Sequence | None = None,
        low_agreement: str = "keep",
        agreement_threshold: float = 0.5,
        **options,
    ):
        if options.get("model") is not None:
            raise ValueError("RewardVote: give the reward models as models: [...] (two or more), not model")
        if options.pop("combine", "mean") != "mean":
            raise ValueError("RewardVote.combine: the vote is the ensemble mean (combine: mean)")
        if not models or len(list(models)) < 2:
            raise ValueError(
                f"RewardVote.models: at least two reward models vote (got {len(list(models or []))}); e.g. "
                "reward.terms.rm.models=[path_a,path_b,path_c]"
            )
        if low_agreement not in LOW_AGREEMENT:
            raise ValueError(f"RewardVote.low_agreement={low_agreement!r}: must be one of {LOW_AGREEMENT}")
        if not 0.0 <= agreement_threshold <= 1.0:
            raise ValueError(f"RewardVote.agreement_threshold={agreement_threshold}: must be in [0, 1]")
        super().__init__(weight, models=list(models), combine="mean", **options)
        self.low_agreement, self.agreement_threshold = low_agreement, float(agreement_threshold)

    def model_scores(self, questions: Sequence[str], completions: Sequence[str]) -> tuple[torch.Tensor, int]:
        """(M, N) normalised scores of each model for each pair (no cache), and the pairs cut at ``max_length``."""
        per, cut = [], 0
        for model, tok in self.scorers():
            logits, c = reward_model_logits(
                model, tok, questions, completions, self.chat_template, self.max_length, self.batch_size
            )
            per.append(self.to_score(logits))
            cut = max(cut, c)
        return torch.stack(per), cut

    def combine_votes(self, scores: torch.Tensor, groups: Sequence[int]) -> tuple[list[float], dict[str, float]]:
        """The term's scores from an (M, N) score matrix, and the voting metrics."""
        st = vote_statistics(scores, groups)
        mean, agreement = st["mean"], st["agreement"]
        low = agreement < self.agreement_threshold
        if self.low_agreement == "shrink":
            g = group_means(mean, groups)
            out = g + agreement * (mean - g)
        elif self.low_agreement == "drop":
            out = torch.where(low, group_means(mean, groups), mean)
        else:
            out = mean
        metrics = {
            "agreement": float(agreement.mean()),
            "std_mean": float(st["std"].mean()),
            "strength_mean": float(st["strength"].mean()) if st["strength"].numel() else 0.0,
            "low_agreement_frac": float(low.float().mean()),
            "models": float(scores.shape[0]),
        }
        return out.tolist(), metrics

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        questions = [self.question_of(s) for s in samples]
        keys = [pair_key("vote", q, s.completion) for q, s in zip(questions, samples)]
        found: list = [self.cache.get(k) for k in keys]
        hits = sum(v is not LRUCache.MISS for v in found)
        todo = [i for i, v in enumerate(found) if v is LRUCache.MISS]
        cut = 0
        if todo:
            self.scorers()  # a model that cannot load is a configuration error: raise
            try:
                new, cut = self.model_scores([questions[i] for i in todo], [samples[i].completion for i in todo])
            except Exception as e:  # the forward failed on the batch: its rows are failures, the run goes on
                log.warning("reward RewardVote failed on a batch of %d: %r", len(todo), e)
                new = None
            for j, i in enumerate(todo):
                found[i] = None if new is None else tuple(new[:, j].tolist())
                if found[i] is not None:
                    self.cache.put(keys[i], found[i])
        failures = [v is None for v in found]
        ok = [i for i, v in enumerate(found) if v is not None]
        scores = [0.0] * len(samples)
        metrics: dict[str, float] = {}
        if ok:
            matrix = torch.tensor([found[i] for i in ok], dtype=torch.float32).T  # (M, n_ok)
            vals, metrics = self.combine_votes(matrix, [samples[i].group for i in ok])
            for i, v in zip(ok, vals):
                scores[i] = float(v)
        metrics.update({"truncated": float(cut), "cache_hits": float(hits), "cache_hit_rate": hits / len(samples)})
        return TermResult(scores, failures, metrics=metrics)
