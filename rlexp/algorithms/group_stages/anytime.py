"""AnytimeReasoner's truncated-thinking budgets ("Optimizing Anytime Reasoning via Budget Relative Policy
Optimization", Qi et al., 2025; arXiv 2505.13438; released code sail-sg/AnytimeReasoner,
``verl/verl/trainer/ppo/brpo.py``), as a group stage.

Each completion's thinking (its tokens up to and including ``</think>``) is cut at token budgets b_1 < … < b_J
drawn from a prior p over the budgets; after each cut the model is made to answer: the context prompt + the first
b_j thinking tokens + an end-of-thinking marker is continued for at most ``summary_tokens`` tokens (the released
code's "...\\n\\n...\\n\\n</think>" + a final-answer delimiter, 118 tokens), and each summary is scored by the
verifier. The scores r_{i,j} are the dense rewards that the BRPO advantage (``rlexp.algorithms.advantages.budget.
brpo``) turns into per-segment advantages of the thinking tokens.

Per row, with e the thinking's length in tokens (through the closing tag; all its tokens when it never closes):

* b_j < e: the thinking is cut at b_j and ``num_summaries`` summaries are sampled and scored (mean);
* b_j ≥ e and the thinking closed: the row's own answer is the summary after the complete thinking: its own score
  under the same term (the released code samples fresh summaries after the complete thinking here);
* b_j ≥ e, not closed, the row ended (EOS): 0 (the released code scores a thinking that ends without ``</think>``
  0); not closed and cut at the generation limit: the whole completion is summarised.

The summaries are sampled with ``ctx.rollout.generate_from_ids`` (``rlexp.rollout.hf.HFRollout``) on token ids: the
sampled thinking is never re-tokenised. They are scored with the reward term named ``metric`` (``ctx.reward_terms``)
on the text marker + summary. Writes ``batch.extras``: ``budget_scores`` (N, J), ``budget_cuts`` (N, J) cut
positions min(b_j, e), ``think_end`` (N,) e, ``think_closed`` (N,), ``budget_probs`` (N, J) the prior per row.
Stats: ``anytime/score_at_budget_<j>`` (j = 1 … J), ``anytime/mean_score`` (Σ_j p_j · mean score at b_j, the
anytime objective), ``anytime/summaries`` (summaries sampled this step), ``anytime/think_closed_frac``.

``train_summaries`` (the decoupled summary policy): each sampled summary joins the batch as a row of its own — its
context as the prompt, the summary as the completion with its sampling log-probs, its thinking row's group — marked
``replayed`` (``rlexp.core.masks.REPLAYED``: not one of the step's own rollouts, so it stays out of the reward and
length metrics, and its sampling log-probs are its ratio's denominator; ``batch/replayed_completions`` counts them)
and ``anytime_summary``, with its score and baseline for the advantage (the released code trains them in the same
sequence as the thinking, under a tree attention mask; ``anytime/summary_rows``).
"""

from __future__ import annotations

import time

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import LOSS_MASK, REPLAYED, TOKEN_LOSS_MASK
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.terms import Sample

BUDGET_SCORES = "budget_scores"
BUDGET_CUTS = "budget_cuts"
BUDGET_PROBS = "budget_probs"
THINK_END = "think_end"
THINK_CLOSED = "think_closed"
SUMMARY_ROW = "anytime_summary"  # (N,) bool: a summary row the stage added (``train_summaries``)
SUMMARY_SCORE = "summary_score"  # (N,) its verified score
SUMMARY_BASELINE = "summary_baseline"  # (N,) its baseline (the released code's)
PRIORS = ("uniform", "linear", "base")
SUMMARY_TOKENS = 118  # the released code's summary length (MAX_ANSWER_LEN 128 − 10)


def budget_prior(budgets: list[int], prior) -> list[float]:
    """The prior p over the budgets: ``uniform``, ``linear`` (∝ b_j), ``base`` (all mass on the largest), or a list
    of non-negative weights (normalised) — the released code's three and any other."""
    J = len(budgets)
    if isinstance(prior, str):
        if prior not in PRIORS:
            raise ValueError(f"anytime budgets prior={prior!r} is not one of {list(PRIORS)} or a list of weights")
        w = {"uniform": [1.0] * J, "linear": [float(b) for b in budgets], "base": [0.0] * (J - 1) + [1.0]}[prior]
    else:
        w = [float(x) for x in prior]
        if len(w) != J or any(x < 0 for x in w) or sum(w) <= 0:
            raise ValueError(f"anytime budgets prior={list(prior)} must be {J} non-negative weights, not all 0")
    s = sum(w)
    return [x / s for x in w]


def think_end(token_texts: list[str], close_tag: str = "</think>") -> tuple[int, bool]:
    """(e, closed): the number of tokens through the one that completes ``close_tag`` in the concatenation of the
    per-token texts, and True; or (len(token_texts), False) when the tag never appears."""
    text = "".join(token_texts)
    at = text.find(close_tag)
    if at < 0:
        return len(token_texts), False
    end_char, seen = at + len(close_tag), 0
    for k, piece in enumerate(token_texts):
        seen += len(piece)
        if seen >= end_char:
            return k + 1, True
    return len(token_texts), True


@GROUP_STAGES.register
class AnytimeBudgets:
    """AnytimeReasoner's budget summaries and their scores (module doc). ``budgets``: token budgets × ``scale``
    (fractions of the generation limit with ``scale=${trainer.max_new_tokens}``), strictly increasing after
    rounding; ``prior``: see ``budget_prior``; ``summary_tokens``: each summary's length limit (null: the released
    118, at most the largest budget)."""

    def __init__(
        self,
        budgets=(0.25, 0.5, 0.75, 1.0),
        scale: float = 1.0,
        prior="linear",
        num_summaries: int = 1,
        summary_tokens: int | None = None,
        close_tag: str = "</think>",
        marker: str = "...\n\n...\n\n</think>\n<answer>",
        metric: str = "accuracy",
        train_summaries: bool = True,
    ):
        if scale <= 0 or not budgets or any(float(b) <= 0 for b in budgets):
            raise ValueError(f"anytime budgets={list(budgets)} and scale={scale} must be positive numbers")
        self.budgets = [max(1, round(float(b) * scale)) for b in budgets]
        if any(a >= b for a, b in zip(self.budgets, self.budgets[1:])):
            raise ValueError(
                f"anytime budgets={list(budgets)} × scale={scale} give token budgets {self.budgets}: they must be "
                "strictly increasing (fewer budgets, or a larger trainer.max_new_tokens)"
            )
        self.probs = budget_prior(self.budgets, prior)
        if summary_tokens is None:  # the released 118 (MAX_ANSWER_LEN 128 − 10), at most the largest budget
            summary_tokens = min(SUMMARY_TOKENS, self.budgets[-1])
        if num_summaries < 1 or summary_tokens < 1:
            raise ValueError(f"anytime num_summaries={num_summaries} and summary_tokens={summary_tokens} must be >= 1")
        self.num_summaries, self.summary_tokens = int(num_summaries), int(summary_tokens)
        self.close_tag, self.marker, self.metric = close_tag, marker, metric
        self.train_summaries = bool(train_summaries)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        rollout, terms, tok = getattr(ctx, "rollout", None), getattr(ctx, "reward_terms", None), ctx.tokenizer
        if rollout is None or not callable(getattr(rollout, "generate_from_ids", None)):
            raise RuntimeError("anytime budgets need a rollout engine with generate_from_ids (rollout=hf)")
        if terms is None or self.metric not in terms:
            raise KeyError(f"anytime budgets metric={self.metric!r} is not a reward term (terms: {list(terms or {})})")
        if self.metric not in batch.reward_names:
            raise KeyError(f"anytime budgets metric={self.metric!r} is not in the batch's terms {batch.reward_names}")
        N, J = len(batch), len(self.budgets)
        device = batch.completion_ids.device
        lengths = batch.completion_mask.sum(-1).tolist()
        own = batch.term(self.metric).float().to(device)
        truncated = batch.truncated.bool().tolist()
        ends, closed = [], []
        for i in range(N):
            ids = batch.completion_ids[i, : int(lengths[i])].tolist()
            e, c = think_end(tok.batch_decode([[t] for t in ids]), self.close_tag)
            ends.append(e)
            closed.append(c)
        scores = torch.zeros(N, J, device=device)
        cuts = torch.zeros(N, J, dtype=torch.long, device=device)
        jobs = []  # (row, budget, cut) to summarise
        for i in range(N):
            for j, b in enumerate(self.budgets):
                cuts[i, j] = min(b, ends[i])
                if b < ends[i] or (not closed[i] and truncated[i]):
                    jobs.append((i, j, int(cuts[i, j])))
                elif closed[i]:
                    scores[i, j] = own[i]
                # else: the thinking ended without closing: 0
        t0 = time.perf_counter()
        out, flat = None, []
        if jobs:
            out, flat = self._summaries(batch, ctx, jobs)
            A = self.num_summaries
            for k, (i, j, _) in enumerate(jobs):
                scores[i, j] = sum(flat[k * A : (k + 1) * A]) / A
        batch.stats["time/anytime_summaries_s"] = time.perf_counter() - t0
        probs = torch.tensor(self.probs, device=device)
        batch.extras[BUDGET_SCORES] = scores
        batch.extras[BUDGET_CUTS] = cuts
        batch.extras[BUDGET_PROBS] = probs.expand(N, J).clone()
        batch.extras[THINK_END] = torch.tensor(ends, dtype=torch.long, device=device)
        batch.extras[THINK_CLOSED] = torch.tensor(closed, dtype=torch.bool, device=device)
        means = scores.mean(0)
        for j in range(J):
            batch.stats[f"anytime/score_at_budget_{j + 1}"] = float(means[j])
        batch.stats["anytime/mean_score"] = float((means * probs).sum())
        batch.stats["anytime/summaries"] = float(len(jobs) * self.num_summaries)
        batch.stats["anytime/think_closed_frac"] = sum(closed) / max(N, 1)
        if self.train_summaries and jobs:
            batch = self._with_summary_rows(batch, ctx, jobs, out, flat, scores)
        batch.stats["anytime/summary_rows"] = float(len(jobs) * self.num_summaries if self.train_summaries else 0)
        return batch

    def _with_summary_rows(self, batch: RolloutBatch, ctx, jobs, out, flat, scores) -> RolloutBatch:
        """The batch with one row per sampled summary (the decoupled summary policy's samples): its context as the
        prompt, the summary as the completion, its sampling log-probs, its group; marked ``replayed`` (not the
        step's own rollouts: out of the reward metrics; the ratio's denominator its sampling log-probs) and
        ``anytime_summary``, with its score and the released code's baseline (one summary per budget: the group's
        mean score at that budget; several: the mean of the summaries after the same cut)."""
        A, N, M = self.num_summaries, len(batch), len(flat)
        device = batch.completion_ids.device
        rows = [jobs[r // A][0] for r in range(M)]
        budgets = [jobs[r // A][1] for r in range(M)]
        gids = batch.group_ids.to(device)
        if A > 1:
            base = [float(scores[i, j]) for i, j in zip(rows, budgets)]
        else:
            _, inv = torch.unique(gids, return_inverse=True)
            k = int(inv.max()) + 1
            sums = torch.zeros(k, scores.shape[1], device=device).index_add_(0, inv, scores)
            means = sums / torch.zeros(k, device=device).index_add_(0, inv, torch.ones(N, device=device))[:, None]
            base = [float(means[inv[i], j]) for i, j in zip(rows, budgets)]
        col = batch.reward_names.index(self.metric)
        rewards = torch.zeros(M, batch.rewards.shape[1], dtype=batch.rewards.dtype, device=batch.rewards.device)
        rewards[:, col] = torch.tensor(flat, dtype=rewards.dtype, device=rewards.device)
        weight = float(batch.reward_weights[col]) if batch.reward_weights is not None else 1.0
        tok = ctx.tokenizer
        thinking = tok.batch_decode([batch.completion_ids[i, :cut].tolist() for i, _, cut in jobs])
        extras = {}
        for key, v in batch.extras.items():
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == N:
                fill = 1 if key in (LOSS_MASK, TOKEN_LOSS_MASK) else 0
                extras[key] = torch.full((M, *v.shape[1:]), fill, dtype=v.dtype, device=v.device)
        extras[REPLAYED] = torch.ones(M, dtype=torch.bool, device=device)
        extras[SUMMARY_ROW] = torch.ones(M, dtype=torch.bool, device=device)
        extras[SUMMARY_SCORE] = torch.tensor(flat, dtype=torch.float32, device=device)
        extras[SUMMARY_BASELINE] = torch.tensor(base, dtype=torch.float32, device=device)
        added = RolloutBatch(
            prompt_ids=out.prompt_ids.to(device),
            prompt_mask=out.prompt_mask.to(device),
            completion_ids=out.completion_ids.to(device),
            completion_mask=out.completion_mask.to(device),
            sampling_logprobs=out.logprobs.to(device=device, dtype=batch.sampling_logprobs.dtype),
            truncated=out.truncated.to(device=device, dtype=batch.truncated.dtype),
            group_ids=gids[torch.tensor(rows, device=device)],
            prompts=[batch.prompts[i] + thinking[r // A] + self.marker for r, i in enumerate(rows)],
            completions=list(out.texts),
            records=[batch.records[i] for i in rows],
            rewards=rewards,
            reward_names=batch.reward_names,
            reward_weights=batch.reward_weights,
            reward=rewards[:, col] * weight,
            reward_failures=torch.zeros(M, rewards.shape[1], dtype=torch.bool, device=rewards.device),
            extras=extras,
        )
        own = dict(batch.extras)
        batch.extras = {k: v for k, v in own.items() if k in extras}
        batch.extras[REPLAYED] = own.get(REPLAYED, torch.zeros(N, dtype=torch.bool, device=device)).bool()
        batch.extras[SUMMARY_ROW] = torch.zeros(N, dtype=torch.bool, device=device)
        batch.extras[SUMMARY_SCORE] = torch.zeros(N, device=device)
        batch.extras[SUMMARY_BASELINE] = torch.zeros(N, device=device)
        merged = RolloutBatch.concat([batch, added])
        merged.extras.update({k: v for k, v in own.items() if k not in extras})  # not per row: kept as they are
        merged.stats = batch.stats
        order = torch.argsort(merged.group_ids.cpu(), stable=True)  # a group's rows stay contiguous
        return merged.select(order)

    def _summaries(self, batch: RolloutBatch, ctx, jobs: list[tuple[int, int, int]]):
        """``num_summaries`` summaries sampled after each job's cut (job-major) and their scores."""
        tok, A = ctx.tokenizer, self.num_summaries
        marker = tok(self.marker, add_special_tokens=False)["input_ids"]
        device = batch.completion_ids.device
        contexts = []
        for i, _, cut in jobs:
            prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
            ctx_ids = torch.cat([prompt, batch.completion_ids[i, :cut], torch.tensor(marker, dtype=torch.long)])
            contexts.extend([ctx_ids] * A)
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), tok.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros(len(contexts), width, dtype=torch.long, device=device)
        for r, c in enumerate(contexts):
            ids[r, width - len(c) :], mask[r, width - len(c) :] = c.to(device), 1
        dtype = getattr(ctx, "autocast_dtype", None)
        policy_device = next(ctx.policy.parameters()).device
        with torch.autocast(policy_device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = ctx.rollout.generate_from_ids(ctx.policy, tok, ids, mask, self.summary_tokens)
        samples = []
        for r, text in enumerate(out.texts):
            i = jobs[r // A][0]
            samples.append(
                Sample(
                    batch.prompts[i],
                    self.marker + text,
                    batch.records[i],
                    int(batch.group_ids[i]),
                    int(out.completion_mask[r].sum()),
                    bool(out.truncated[r]),
                    out.completion_ids[r][out.completion_mask[r].bool()].tolist(),
                )
            )
        res = ctx.reward_terms[self.metric](samples)
        return out, [0.0 if s is None else float(s) for s in res.scores]
