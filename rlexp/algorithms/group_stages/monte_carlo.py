"""Monte-Carlo values at points of a sampled completion, in place of a critic: VinePPO's step values ("VinePPO:
Refining Credit Assignment in RL Training of LLMs", Kazemnejad et al., 2024, arXiv 2410.01679; released code
McGill-NLP/VinePPO, ``src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py``) and SPO-chain's
cutpoint values ("Segment Policy Optimization: Effective Segment-Level Credit Assignment in RL for Large Language
Models", Guo et al., 2025, arXiv 2505.23564; released code AIFrameResearch/SPO, the same file in its fork of VinePPO's
code base, and ``src/treetune/trainers/ppo_trainer.py``).

A state of a completion y = (y_0 … y_{L−1}) of prompt x is the prefix s_b = (x, y_0 … y_{b−1}); b = 0 is the prompt.
The stage picks boundaries 0 ≤ b_0 < b_1 < … < b_m < L in each completion (``boundaries``):

* ``steps`` (VinePPO): the prompt and the start of each reasoning step. Steps are ``rlexp.rewards.process.split_steps``
  spans (``split``: ``lines``, the released GSM8K delimiter ``"\\n"``; ``sentences`` approximates the released MATH
  splitter at line breaks and sentence ends); a step that starts with ``answer_marker`` (the ``#### <answer>`` line)
  is merged into the one before it, as the release merges the answer into the last step. Step k > 0 starts at the
  token after the one that holds step k − 1's last character (``rlexp.rewards.process.token_positions``): the line
  break goes with the step it opens, as in the release's character spans;
* ``cutpoints`` (SPO-chain): the tokens the policy sampled with probability p_t < ``threshold`` (0.9; p at the
  rollout temperature: ``batch.sampling_logprobs``) are the cutpoints; every ``interval``-th of them, from the first
  (the released ``cutpoints[::cutpoint_interval]``), starts a segment: b is the state just before that token (the
  release's "cutpoint − 1"; the prompt when it is the first token).

For each distinct state (prompt ids + prefix ids: the G completions of a prompt share its b = 0 state, sampled once,
as the release de-duplicates its value queries), ``num_rollouts`` K continuations are sampled from the prefix with the
current policy (``ctx.rollout.generate_from_ids``: the prefix is continued as token ids, never re-tokenised), each
at most L_max − b tokens (L_max = the rollout's ``max_new_tokens``: prefix and continuation share the completion's
limit, as the release sizes ``max_tokens`` from the context left), and each whole completion (prefix + continuation)
is scored by the run's reward terms (``rlexp.rewards.scoring.score``: the weighted total, as the rows' own reward;
each state's K continuations are a group of their own for group-aware terms). V̂(s_b) is their mean; a continuation
that reaches the limit without EOS scores ``truncated_reward`` instead (the releases' unfinished-response penalty 0;
null: the terms' score), and so does the row's own outcome when the row was truncated. ``max_steps``: only the first
``max_steps`` + 1 boundaries of a row are sampled (the prompt and the ends of its first ``max_steps`` steps); the later
ones' value is the row's outcome (the release's ``max_step_for_value_estimation``, whose unestimated values are
filled backwards with r_k + V̂(s_{k+1}) = the outcome: the step after the last sampled state gets outcome − V̂, the
later steps 0).

Writes ``batch.extras``: ``mc_boundaries`` (N, B) long, each row's boundaries, −1 past them; ``mc_values`` (N, B)
float, V̂ at each (NaN past them); ``mc_outcome`` (N,) the row's outcome as the values see it — what
``rlexp.algorithms.advantages.segment_values`` turns into per-token advantages. ``prob_mask`` (SPO-chain's
probability mask): the tokens sampled with p ≥ ``threshold`` leave the loss (``batch.extras["token_loss_mask"]``,
``rlexp.core.masks``; the released trainer's ``action_mask & (exp(old_logprobs) < 0.9)``, which also masks the KL
term and the whitening statistics).

Put it last among the group stages: it reads the rows' final rewards, and its per-row extras are as wide as its
boundaries. It needs a single-turn rollout engine with ``generate_from_ids`` (``rollout=hf``).

Metrics (prefix ``metric_prefix``: ``vineppo`` for steps, ``spo`` for cutpoints): ``<p>/segments_mean`` (boundaries
per completion: VinePPO's steps, SPO's segments), ``<p>/states`` (distinct states sampled), ``<p>/mc_rollouts``
(continuations sampled: states × K), ``<p>/value_mean`` (mean V̂ over the sampled states), ``<p>/value_std_mean``
(the mean over states of the K rewards' standard deviation: the release's ``mc_roll_std``),
``<p>/mc_truncated_frac`` (continuations cut at the limit), ``<p>/unestimated`` (boundaries past ``max_steps``);
cutpoints: ``<p>/low_prob_frac`` (share of completion tokens sampled with p < threshold: the tokens that train under
the probability mask); ``time/mc_generate_s``. The continuations' scoring time goes to ``time/reward_s``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from rlexp.algorithms.group_stages.guidance import _require, left_padded
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import POLICY_TOKENS, TOKEN_LOSS_MASK
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.process import SPLIT_MODES, split_steps, token_positions

MC_BOUNDARIES = "mc_boundaries"  # (N, B) long: each row's boundaries b (state = prompt + completion[:b]), −1 after
MC_VALUES = "mc_values"  # (N, B) float: V̂ at each boundary, NaN after
MC_OUTCOME = "mc_outcome"  # (N,) float: the row's outcome (the last segment's next value)
BOUNDARIES = ("steps", "cutpoints")
PREFIXES = {"steps": "vineppo", "cutpoints": "spo"}


def step_boundaries(
    tokenizer,
    ids: Sequence[int],
    text: str,
    split: str = "lines",
    pattern: str | None = None,
    answer_marker: str | None = "####",
) -> list[int]:
    """VinePPO's states of one completion as token indices: 0 (the prompt) and the first token of each later step
    (the token after the one holding the previous step's last character; see the module doc). ``ids``: the
    completion's tokens (EOS included), ``text`` their decoding."""
    if not ids:
        return []
    spans = split_steps(text, split, pattern)
    if answer_marker:  # the answer line joins the step before it (the release's answer merge)
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and text[a:b].startswith(answer_marker):
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        spans = merged
    ends = [b for _, b in spans[:-1]]  # every step but the last is followed by another
    starts = {p + 1 for p in token_positions(tokenizer, list(ids), text, ends)}
    return sorted(b for b in {0, *starts} if b < len(ids))


def cutpoint_boundaries(logprobs: Sequence[float], threshold: float = 0.9, interval: int = 5) -> list[int]:
    """SPO-chain's segment starts of one completion: the tokens sampled with probability exp(logprob) < ``threshold``
    (the cutpoints), every ``interval``-th from the first; each boundary is the index of that token (its state is the
    prefix before it)."""
    low = [t for t, lp in enumerate(logprobs) if math.exp(float(lp)) < threshold]
    return low[::interval]


def sample_continuations(ctx, jobs: list[tuple[int, list[int]]], batch: RolloutBatch, k: int, limit: int, chunk: int):
    """K continuations of each job (row, prefix ids) from the row's prompt + prefix, sampled by the policy at the
    rollout's settings: an unscored ``RolloutBatch`` of len(jobs) · K rows (job-major) whose completions are
    prefix + continuation (``limit`` tokens at most: a continuation past limit − len(prefix) is cut and truncated),
    under the row's prompt; each job's K rows are a group of their own. ``chunk`` > 0: that many contexts per call."""
    tok = ctx.tokenizer
    device = batch.completion_ids.device
    pad = tok.pad_token_id
    prompts = {r: batch.prompt_ids[r][batch.prompt_mask[r].bool()].tolist() for r, _ in jobs}
    order = sorted(range(len(jobs)), key=lambda j: len(jobs[j][1]))  # similar budgets share a call
    contexts = [(j, prompts[jobs[j][0]] + jobs[j][1]) for j in order for _ in range(k)]
    step = chunk if chunk > 0 else len(contexts)
    dtype = getattr(ctx, "autocast_dtype", None)
    policy_device = next(ctx.policy.parameters()).device
    continued: dict[int, list[tuple[list[int], bool]]] = {j: [] for j in range(len(jobs))}
    for i in range(0, len(contexts), step):
        part = contexts[i : i + step]
        ids, mask = left_padded([c for _, c in part], pad, device)
        shortest = min(len(jobs[j][1]) for j, _ in part)
        with torch.autocast(policy_device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = ctx.rollout.generate_from_ids(ctx.policy, tok, ids, mask, limit - shortest)
        for r, (j, _) in enumerate(part):
            room = limit - len(jobs[j][1])
            n = int(out.completion_mask[r].sum())
            kept = min(n, room)
            continued[j].append((out.completion_ids[r, :kept].tolist(), bool(out.truncated[r]) or n > room))
    tokens, truncated, rows, groups = [], [], [], []
    next_group = int(batch.group_ids.max()) + 1 if len(batch) else 0
    for j, (r, prefix) in enumerate(jobs):
        for cont, cut in continued[j]:
            tokens.append(prefix + cont)
            truncated.append(cut)
            rows.append(r)
            groups.append(next_group + j)
    width = max(1, max(len(t) for t in tokens))
    completion = torch.full((len(tokens), width), pad, dtype=batch.completion_ids.dtype, device=device)
    cmask = torch.zeros(len(tokens), width, dtype=batch.completion_mask.dtype, device=device)
    for i, t in enumerate(tokens):
        if t:
            completion[i, : len(t)] = torch.tensor(t, dtype=completion.dtype, device=device)
            cmask[i, : len(t)] = 1
    index = torch.tensor(rows, dtype=torch.long, device=batch.prompt_ids.device)
    return RolloutBatch(
        prompt_ids=batch.prompt_ids[index].clone(),
        prompt_mask=batch.prompt_mask[index].clone(),
        completion_ids=completion,
        completion_mask=cmask,
        sampling_logprobs=torch.zeros(len(tokens), width, device=device),
        truncated=torch.tensor(truncated, dtype=torch.bool, device=batch.truncated.device),
        group_ids=torch.tensor(groups, dtype=batch.group_ids.dtype, device=batch.group_ids.device),
        prompts=[batch.prompts[r] for r in rows],
        completions=tok.batch_decode(tokens, skip_special_tokens=True),
        records=[batch.records[r] for r in rows],
    )


@GROUP_STAGES.register
class MonteCarloValues:
    """Monte-Carlo state values at boundaries of each completion (VinePPO's steps, SPO-chain's cutpoints), from K
    continuations sampled by the policy and scored by the run's reward terms (see the module doc).

    ``boundaries``: ``steps`` | ``cutpoints``. Steps: ``split`` (a ``split_steps`` mode), ``pattern`` (``tagged``),
    ``answer_marker`` (null: no merge). Cutpoints: ``threshold``, ``interval``. ``num_rollouts``: K.
    ``truncated_reward``: the score of a continuation (and of a row's own outcome) cut at the length limit (null:
    the terms'). ``max_steps``: boundaries past the first ``max_steps`` + 1 are not sampled (null: all).
    ``prob_mask``: the tokens sampled with p ≥ ``threshold`` leave the loss (SPO-chain). ``chunk``: contexts per
    generation call (0: all at once). ``metric_prefix``: null → vineppo (steps) | spo (cutpoints)."""

    needs_reference = False
    provides_extras = (MC_BOUNDARIES, MC_VALUES, MC_OUTCOME, TOKEN_LOSS_MASK)

    def __init__(
        self,
        boundaries: str = "steps",
        num_rollouts: int = 9,
        split: str = "lines",
        pattern: str | None = None,
        answer_marker: str | None = "####",
        threshold: float = 0.9,
        interval: int = 5,
        truncated_reward: float | None = 0.0,
        max_steps: int | None = None,
        prob_mask: bool = False,
        chunk: int = 0,
        metric_prefix: str | None = None,
    ):
        where = "algorithm.group_stages: MonteCarloValues"
        if boundaries not in BOUNDARIES:
            raise ValueError(f"{where}.boundaries={boundaries!r} is not one of {list(BOUNDARIES)}")
        if not isinstance(num_rollouts, int) or num_rollouts < 1:
            raise ValueError(f"{where}.num_rollouts={num_rollouts!r} must be an integer >= 1")
        if split not in SPLIT_MODES:
            raise ValueError(f"{where}.split={split!r} is not one of {list(SPLIT_MODES)}")
        if not 0.0 < float(threshold) <= 1.0:
            raise ValueError(f"{where}.threshold={threshold} must be in (0, 1]")
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"{where}.interval={interval!r} must be an integer >= 1")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 0):
            raise ValueError(f"{where}.max_steps={max_steps!r} must be an integer >= 0 or null")
        if prob_mask and boundaries != "cutpoints":
            raise ValueError(f"{where}.prob_mask=true is SPO-chain's mask of its cutpoints: set boundaries=cutpoints")
        if not isinstance(chunk, int) or chunk < 0:
            raise ValueError(f"{where}.chunk={chunk!r} must be an integer >= 0")
        if truncated_reward is not None and not math.isfinite(float(truncated_reward)):
            raise ValueError(f"{where}.truncated_reward={truncated_reward} must be a finite number or null")
        self.boundaries, self.num_rollouts = boundaries, num_rollouts
        self.split, self.pattern, self.answer_marker = split, pattern, answer_marker
        self.threshold, self.interval = float(threshold), interval
        self.truncated_reward = None if truncated_reward is None else float(truncated_reward)
        self.max_steps, self.prob_mask, self.chunk = max_steps, bool(prob_mask), chunk
        self.prefix = metric_prefix or PREFIXES[boundaries]

    def _check(self, batch: RolloutBatch, ctx) -> None:
        _require(ctx, ("policy", "tokenizer", "rollout", "reward_terms"), "MonteCarloValues", "sample continuations")
        if not callable(getattr(ctx.rollout, "generate_from_ids", None)):
            raise RuntimeError(
                "algorithm.group_stages: MonteCarloValues continues prefixes as token ids: it needs a rollout engine "
                f"with generate_from_ids (rollout=hf), not {type(ctx.rollout).__name__}"
            )
        if POLICY_TOKENS in batch.extras:
            raise ValueError(
                "algorithm.group_stages: MonteCarloValues continues single-turn completions; these rows are "
                "multi-turn episodes (batch.extras['policy_tokens']): use a single-turn rollout"
            )
        if batch.reward is None:
            raise RuntimeError("MonteCarloValues runs after the reward stage: the batch has no reward yet")

    def row_boundaries(self, batch: RolloutBatch, ctx, i: int) -> list[int]:
        """Row ``i``'s boundaries (see the module doc)."""
        n = int(batch.completion_mask[i].sum())
        if self.boundaries == "cutpoints":
            return cutpoint_boundaries(batch.sampling_logprobs[i, :n].tolist(), self.threshold, self.interval)
        ids = batch.completion_ids[i, :n].tolist()
        return step_boundaries(ctx.tokenizer, ids, batch.completions[i], self.split, self.pattern, self.answer_marker)

    def _outcomes(self, rewards: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
        r = rewards.detach().float().cpu()
        if self.truncated_reward is None:
            return r
        return torch.where(truncated.bool().cpu(), torch.full_like(r, self.truncated_reward), r)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        from rlexp.rewards.scoring import score

        if len(batch) == 0:
            return batch
        self._check(batch, ctx)
        N, p = len(batch), self.prefix
        limit = int(ctx.rollout.max_new_tokens)
        outcome = self._outcomes(batch.reward, batch.truncated)
        bounds = [self.row_boundaries(batch, ctx, i) for i in range(N)]
        keys: dict[tuple, int] = {}  # distinct state → its job
        jobs: list[tuple[int, list[int]]] = []
        state_of: list[list[int | None]] = []  # per row and boundary: its job, None past max_steps
        for i, bs in enumerate(bounds):
            prompt = tuple(batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist())
            row = []
            for j, b in enumerate(bs):
                if self.max_steps is not None and j > self.max_steps:
                    row.append(None)
                    continue
                prefix = batch.completion_ids[i, :b].tolist()
                key = (prompt, tuple(prefix))
                if key not in keys:
                    keys[key] = len(jobs)
                    jobs.append((i, prefix))
                row.append(keys[key])
            state_of.append(row)
        K = self.num_rollouts
        values = torch.zeros(len(jobs))
        stds, truncated_frac, t_gen, t_score = [], 0.0, 0.0, 0.0
        if jobs:
            t0 = time.perf_counter()
            cont = sample_continuations(ctx, jobs, batch, K, limit, self.chunk)
            t1 = time.perf_counter()
            score(cont, ctx.reward_terms)
            t_gen, t_score = t1 - t0, time.perf_counter() - t1
            scores = self._outcomes(cont.reward, cont.truncated).view(len(jobs), K)
            values = scores.mean(-1)
            stds = scores.std(-1, unbiased=False).tolist()
            truncated_frac = float(cont.truncated.float().mean())
        B = max((len(bs) for bs in bounds), default=0)
        device = batch.completion_ids.device
        b_out = torch.full((N, B), -1, dtype=torch.long)
        v_out = torch.full((N, B), float("nan"))
        unestimated = 0
        for i, (bs, row) in enumerate(zip(bounds, state_of)):
            for j, (b, job) in enumerate(zip(bs, row)):
                b_out[i, j] = b
                v_out[i, j] = outcome[i] if job is None else values[job]
                unestimated += int(job is None)
        batch.extras[MC_BOUNDARIES] = b_out.to(device)
        batch.extras[MC_VALUES] = v_out.to(device)
        batch.extras[MC_OUTCOME] = outcome.to(device)
        mask = batch.completion_mask.bool()
        stats = {
            f"{p}/segments_mean": sum(len(bs) for bs in bounds) / N,
            f"{p}/states": float(len(jobs)),
            f"{p}/mc_rollouts": float(len(jobs) * K),
            f"{p}/value_mean": float(values.mean()) if len(jobs) else 0.0,
            f"{p}/value_std_mean": sum(stds) / len(stds) if stds else 0.0,
            f"{p}/mc_truncated_frac": truncated_frac,
            f"{p}/unestimated": float(unestimated),
            "time/mc_generate_s": t_gen,
        }
        if self.boundaries == "cutpoints":
            low = (batch.sampling_logprobs.float().exp() < self.threshold) & mask
            stats[f"{p}/low_prob_frac"] = float(low.sum()) / max(float(mask.sum()), 1.0)
            if self.prob_mask:
                weights = low.float()
                prev = batch.extras.get(TOKEN_LOSS_MASK)
                batch.extras[TOKEN_LOSS_MASK] = weights if prev is None else prev.float() * weights
        batch.stats.update(stats)
        batch.stats["time/reward_s"] = batch.stats.get("time/reward_s", 0.0) + t_score
        return batch
