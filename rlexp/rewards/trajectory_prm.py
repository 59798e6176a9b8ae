"""Trajectory-aware process reward (ReasonFlux-PRM, issue 23): "ReasonFlux-PRM: Trajectory-Aware PRMs for Long
Chain-of-Thought Reasoning in LLMs" (Zou, Yang et al., 2025; arXiv 2506.18896; code github.com/Gen-Verse/ReasonFlux,
``ReasonFlux_PRM/``).

A reasoning model writes a thinking trajectory s = (s_1..s_T) and then a final response a. ReasonFlux-PRM scores
both levels: a step reward r̂_t for each trajectory step and a trajectory-level reward r̂_final for the whole
(trajectory, response) pair, combined as

    r̂ = (1/T) Σ_t r̂_t + α · r̂_final                       (the paper's composite PRM score; α = 1 by default)

and, as the online RL reward of GRPO, blended with the rule-based outcome reward r_out:

    r = (1 − β) · r_out + β · r̂.

The released RL code (``Application/verl/workers/fsdp_workers.py``, ``compute_rm_score``) uses β = 0.75 and the
DAPO rule-based outcome in ±1 (``math_dapo.compute_score``), and reads the PRM's score of the whole response as one
step (``"<extra_0>".join([response]) + "<extra_0>"``): that is our default trajectory-level reading.

The parts, each usable alone:

* ``split_trajectory(text, mode)`` — (trajectory, response): ``think`` — the text inside ``<think>…</think>`` and the
  text after it (a completion that only closes the tag, as with R1 templates that open it in the prompt, has its
  trajectory before ``</think>``; an unclosed tag: all trajectory, no response); ``final_paragraph`` — the last
  paragraph (or, in a one-paragraph text, the last line) is the response and the text before it the trajectory;
  ``auto`` — ``think`` when a tag is present, else ``final_paragraph``.
* ``TrajectoryPRMReward`` — the reward term: trajectory steps (``split``; a completion without a trajectory has its
  response's steps scored instead, counted in ``thinking_frac``) scored by a step scorer (``prm_model``: a PRM
  checkpoint through ``rlexp.rewards.process.PRMScorer``, ``qwen_prm`` convention by default — ReasonFlux-PRM-7B's:
  steps ended by ``<extra_0>``, label 1's probability; or ``step_scorer``: any ``StepScorer``, e.g. a
  ``StepJudge`` or ``TrajectorySignals``); the trajectory scored by ``trajectory_scorer`` (any reward term scoring
  samples, e.g. ``rlexp.rewards.reward_model.RewardModel`` or ``rlexp.rewards.judges.GenerativeJudge``; fed the full
  completion or, ``trajectory_input: response``, the response alone) or, unset, by the step scorer reading the whole
  completion as one step; the outcome by ``verifier`` (``Accuracy``). Scores cached per (question, completion).
* ``TrajectorySignals`` — a step scorer built from the paper's three step-level signals (its PRM's training labels),
  for runs without a trained ReasonFlux-PRM: alignment r_align = max_j cos(Φ(s_t), Φ(a_j)) with the response's
  steps a_j, quality r_qual (any ``StepScorer``: a judge's verdict on the step; the paper's GPT-4o judge
  J(s_t | x, s_<t, a)), coherence r_coh = log softmax of sim(Φ(s_{t−1}), ·)/τ at s_t against the steps of the other
  rows of the batch (unrelated trajectories; s_0's predecessor is the question), fused per step by their softmax
  weights r_t = Σ_k softmax(r_align, r_qual, r_coh)_k · r_k. Φ: mean-pooled last hidden states of an encoder
  (``encoder_model``: ``initial``, ``policy`` or a model config; the paper's pretrained encoder is not named here)
  or any ``embed(texts) -> (n, d)`` function.

A row whose step or trajectory scoring fails is a FAILURE of the term (``reward/<term>/failures``), scored by its
outcome part alone, (1 − β)·r_out; never a crash. A blank completion (no step) is "does not apply" (missing), scored
(1 − β)·r_out too. Metrics (``reward/<term>/...``): ``prm_mean`` (r̂ over the rows
the PRM scored — the mechanism), ``step_mean`` (the step part), ``trajectory_mean`` (r̂_final), ``outcome_mean``
(r_out), ``steps_mean``, ``thinking_frac`` (rows with a thinking trajectory), ``prm_scored_frac``, ``cache_hits``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import torch

from rlexp.core.registry import REWARDS
from rlexp.rewards.judges import JudgeBackend
from rlexp.rewards.process import QWEN_SYSTEM, SPLIT_MODES, PRMScorer, split_steps
from rlexp.rewards.reward_model import LRUCache, pair_key
from rlexp.rewards.terms import Accuracy, RewardTerm, Sample, TermResult

log = logging.getLogger(__name__)

TRAJECTORY_SPLITS = ("auto", "think", "final_paragraph")
OUTCOME_SCALES = ("signed", "unit")
TRAJECTORY_INPUTS = ("full", "response")
SIGNALS = ("alignment", "quality", "coherence")


def split_trajectory(
    text: str, mode: str = "auto", open_tag: str = "<think>", close_tag: str = "</think>"
) -> tuple[str, str]:
    """(thinking trajectory, final response) of a completion, both stripped (see the module docstring)."""
    if mode not in TRAJECTORY_SPLITS:
        raise ValueError(f"trajectory_split={mode!r} is not one of {list(TRAJECTORY_SPLITS)}")
    if mode == "auto":
        mode = "think" if (open_tag in text or close_tag in text) else "final_paragraph"
    if mode == "think":
        i = text.find(open_tag)
        start = i + len(open_tag) if i >= 0 else 0
        j = text.find(close_tag, start)
        if i < 0 and j < 0:
            return "", text.strip()
        if j < 0:  # opened, never closed (cut at the token limit): all trajectory
            return text[start:].strip(), ""
        return text[start:j].strip(), text[j + len(close_tag) :].strip()
    for unit in ("paragraphs", "lines"):
        spans = split_steps(text, unit)
        if len(spans) >= 2:
            cut = spans[-1][0]
            return text[:cut].strip(), text[cut:].strip()
    return "", text.strip()


def fuse_signals(values: Sequence[float]) -> float:
    """ReasonFlux-PRM's step reward from its signals: Σ_k softmax(values)_k · values_k."""
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return float(sum(w * v for w, v in zip(weights, values)) / total)


def _bind(part, model, tokenizer) -> None:
    """Give a scorer the policy (a judge that judges with it, or with its initial copy)."""
    if part is None:
        return
    if hasattr(part, "bind_policy"):
        part.bind_policy(model, tokenizer)
    elif hasattr(part, "bind"):
        part.bind(model, tokenizer)


class TrajectorySignals:
    """The paper's step signals as a step scorer (module docstring). ``quality``: a ``StepScorer`` (required when
    ``quality`` is in ``signals``); ``embed``: ``texts -> (n, d)`` tensor, else the mean-pooled last hidden state of
    ``encoder_model`` (``initial`` | ``policy`` | a model config). ``tau``: the coherence temperature;
    ``max_negatives``: the other rows' steps kept as negatives (the first ones, in batch order)."""

    def __init__(
        self,
        quality=None,
        signals: Sequence[str] = SIGNALS,
        embed: Callable[[list[str]], torch.Tensor] | None = None,
        encoder_model=None,
        device: str = "auto",
        tau: float = 0.1,
        max_negatives: int = 32,
        batch_size: int = 16,
        max_length: int = 512,
    ):
        signals = tuple(signals)
        if not signals or any(s not in SIGNALS for s in signals) or len(set(signals)) != len(signals):
            raise ValueError(f"TrajectorySignals.signals={list(signals)}: distinct names from {list(SIGNALS)}")
        if "quality" in signals and quality is None:
            raise ValueError("TrajectorySignals.quality is not set: a step scorer (e.g. a StepJudge) for r_qual")
        if quality is not None and not (hasattr(quality, "score_steps") or hasattr(quality, "score_batch")):
            raise ValueError(f"TrajectorySignals.quality={type(quality).__name__}: it has no score_steps/score_batch")
        needs_embed = any(s in signals for s in ("alignment", "coherence"))
        if needs_embed and embed is None and encoder_model is None:
            raise ValueError(
                "TrajectorySignals: alignment and coherence need an encoder: set encoder_model (initial | policy | a "
                "model config) or embed"
            )
        if tau <= 0 or max_negatives < 0 or batch_size < 1 or max_length < 1:
            raise ValueError(
                f"TrajectorySignals: tau ({tau}) > 0, max_negatives ({max_negatives}) >= 0, batch_size ({batch_size}) "
                f"and max_length ({max_length}) >= 1"
            )
        self.quality, self.signals, self.tau = quality, signals, float(tau)
        self.max_negatives, self.batch_size, self.max_length = int(max_negatives), int(batch_size), int(max_length)
        self._embed = embed
        self.encoder = None
        if needs_embed and embed is None:
            self.encoder = JudgeBackend(encoder_model, device, owner="TrajectorySignals")

    def bind(self, model, tokenizer, autocast_dtype=None) -> None:
        if self.encoder is not None:
            self.encoder.bind(model, tokenizer, autocast_dtype)
        _bind(self.quality, model, tokenizer)

    @torch.no_grad()
    def embed(self, texts: list[str]) -> torch.Tensor:
        """(n, d) unit vectors Φ(text)."""
        if not texts:
            return torch.zeros(0, 1)
        if self._embed is not None:
            vecs = torch.as_tensor(self._embed(list(texts)), dtype=torch.float32)
        else:
            model, tok = self.encoder.model()
            device = next(model.parameters()).device
            out, side = [], tok.padding_side
            tok.padding_side = "right"
            try:
                for k in range(0, len(texts), self.batch_size):
                    enc = tok(
                        [t or " " for t in texts[k : k + self.batch_size]],
                        return_tensors="pt", padding=True, truncation=True, max_length=self.max_length,
                    ).to(device)  # fmt: skip
                    hidden = model(**enc, output_hidden_states=True).hidden_states[-1].float()
                    m = enc["attention_mask"].unsqueeze(-1).float()
                    out.append(((hidden * m).sum(1) / m.sum(1).clamp(min=1.0)).cpu())
            finally:
                tok.padding_side = side
            vecs = torch.cat(out)
        return torch.nn.functional.normalize(vecs, dim=-1)

    def _quality(self, questions, steps_lists) -> list[list[float] | None]:
        if hasattr(self.quality, "score_batch"):
            return list(self.quality.score_batch(list(questions), [list(s) for s in steps_lists]))
        return [self.quality.score_steps(q, list(s)) for q, s in zip(questions, steps_lists)]

    def score_trajectories(
        self, questions: Sequence[str], steps_lists: Sequence[list[str]], responses: Sequence[str] | None
    ) -> list[list[float] | None]:
        """Each row's fused step scores (None where the quality scorer could not score the row)."""
        n = len(questions)
        per_signal: dict[str, list] = {}
        if "quality" in self.signals:
            per_signal["quality"] = self._quality(questions, steps_lists)
        if "alignment" in self.signals or "coherence" in self.signals:
            texts, index = [], {}

            def at(text: str) -> int:
                if text not in index:
                    index[text] = len(texts)
                    texts.append(text)
                return index[text]

            step_ix = [[at(s) for s in steps] for steps in steps_lists]
            q_ix = [at(q) for q in questions]
            resp_ix = []
            for r in responses if responses is not None else [None] * n:
                parts = [r[a:b] for a, b in split_steps(r, "paragraphs")] if r else []
                resp_ix.append([at(p) for p in parts])
            emb = self.embed(texts)
            sim = emb @ emb.T
            if "alignment" in self.signals:
                rows = []
                for steps, resp in zip(step_ix, resp_ix):
                    if not resp:  # no response to align with: the signal is left out of the fusion
                        rows.append([None] * len(steps))
                    else:
                        rows.append([float(sim[s, resp].max()) for s in steps])
                per_signal["alignment"] = rows
            if "coherence" in self.signals:
                rows = []
                for i, steps in enumerate(step_ix):
                    negs = [s for j, other in enumerate(step_ix) if j != i for s in other if s not in steps]
                    negs = list(dict.fromkeys(negs))[: self.max_negatives]
                    row = []
                    for t, s in enumerate(steps):
                        prev = q_ix[i] if t == 0 else steps[t - 1]
                        logits = sim[prev, [s, *negs]] / self.tau
                        row.append(float(torch.log_softmax(logits, 0)[0]))
                    rows.append(row)
                per_signal["coherence"] = rows
        out: list[list[float] | None] = []
        for i in range(n):
            cols = [per_signal[k][i] for k in self.signals]
            if any(c is None or len(c) != len(steps_lists[i]) for c in cols):
                out.append(None)
                continue
            fused = []
            for t in range(len(steps_lists[i])):
                values = [float(c[t]) for c in cols if c[t] is not None]
                fused.append(fuse_signals(values) if values else 0.0)
            out.append(fused)
        return out

    def score_batch(self, questions: Sequence[str], steps_lists: Sequence[list[str]]) -> list[list[float] | None]:
        """Without the responses: alignment is left out of the fusion."""
        return self.score_trajectories(questions, steps_lists, None)

    def score_steps(self, question: str, steps: list[str]) -> list[float] | None:
        return self.score_batch([question], [steps])[0]


@REWARDS.register
class TrajectoryPRMReward(RewardTerm):
    """ReasonFlux-PRM's RL reward r = (1 − β)·r_out + β·(mean step score + α·trajectory score) (module docstring).
    ``outcome_scale``: ``signed`` — r_out = 2·verifier − 1 in {−1, 1} (the released code's DAPO outcome) | ``unit``
    — the verifier's 0/1."""

    def __init__(
        self,
        weight: float = 1.0,
        beta: float = 0.75,
        alpha: float = 1.0,
        outcome_scale: str = "signed",
        verifier: RewardTerm | None = None,
        answer_format: str = "hash",
        prm_model: str | None = None,
        prm_style: str = "qwen_prm",
        trust_remote_code: bool = False,
        step_tag: str = " ки",
        good_token: str = "+",
        bad_token: str = "-",
        template: str = "{question} {steps}",
        step_join: str = "\n",
        system_prompt: str = QWEN_SYSTEM,
        device: str = "auto",
        dtype: str = "float32",
        batch_size: int = 8,
        max_length: int = 4096,
        step_scorer=None,
        trajectory_scorer=None,
        trajectory_input: str = "full",
        trajectory_split: str = "auto",
        think_open: str = "<think>",
        think_close: str = "</think>",
        split: str = "paragraphs",
        tag_pattern: str | None = None,
        max_steps: int = 64,
        question_key: str = "question",
        cache: int = 4096,
    ):
        super().__init__(weight)
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta={beta}: the PRM's share of the reward must be in [0, 1]")
        if alpha < 0:
            raise ValueError(f"alpha={alpha}: the trajectory-level weight must be >= 0")
        if outcome_scale not in OUTCOME_SCALES:
            raise ValueError(f"outcome_scale={outcome_scale!r} is not one of {list(OUTCOME_SCALES)}")
        if trajectory_input not in TRAJECTORY_INPUTS:
            raise ValueError(f"trajectory_input={trajectory_input!r} is not one of {list(TRAJECTORY_INPUTS)}")
        if trajectory_split not in TRAJECTORY_SPLITS:
            raise ValueError(f"trajectory_split={trajectory_split!r} is not one of {list(TRAJECTORY_SPLITS)}")
        if split not in SPLIT_MODES:
            raise ValueError(f"split={split!r} is not one of {list(SPLIT_MODES)}")
        if max_steps < 1:
            raise ValueError(f"max_steps={max_steps} must be >= 1")
        if verifier is not None and not callable(verifier):
            raise ValueError(f"verifier={verifier!r}: a reward term (a _target_ node)")
        if trajectory_scorer is not None and not callable(trajectory_scorer):
            raise ValueError(
                f"trajectory_scorer={trajectory_scorer!r}: a reward term scoring samples (RewardModel, GenerativeJudge)"
            )
        if step_scorer is None:
            if not prm_model:
                raise ValueError(
                    "prm_model is null and no step_scorer is given: no process reward model is set. Give a PRM "
                    "checkpoint in this term's `prm_model` (reward.terms.<name>.prm_model, e.g. "
                    "Gen-Verse/ReasonFlux-PRM-7B with prm_style=qwen_prm trust_remote_code=true) or a step scorer in "
                    "reward.terms.<name>.step_scorer (e.g. rlexp.rewards.step_judges.StepJudge)"
                )
            step_scorer = PRMScorer(
                prm_model, style=prm_style, step_tag=step_tag, good_token=good_token, bad_token=bad_token,
                template=template, step_join=step_join, system_prompt=system_prompt, device=device, dtype=dtype,
                batch_size=batch_size, max_length=max_length, trust_remote_code=trust_remote_code,
            )  # fmt: skip
        if not (hasattr(step_scorer, "score_steps") or hasattr(step_scorer, "score_batch")):
            raise ValueError(f"step_scorer {type(step_scorer).__name__} has no score_steps(question, steps)")
        self.beta, self.alpha, self.outcome_scale = float(beta), float(alpha), outcome_scale
        self.verifier = verifier if verifier is not None else Accuracy(answer_format=answer_format)
        self.step_scorer, self.trajectory_scorer, self.trajectory_input = (
            step_scorer,
            trajectory_scorer,
            trajectory_input,
        )
        self.trajectory_split, self.think_open, self.think_close = trajectory_split, think_open, think_close
        self.split, self.tag_pattern, self.max_steps = split, tag_pattern, int(max_steps)
        self.question_key = question_key
        self.cache = LRUCache(cache)

    def bind_policy(self, model, tokenizer) -> None:
        """The trainer's policy for judges among the scorers (``initial``: copied now; ``policy``)."""
        _bind(self.step_scorer, model, tokenizer)
        _bind(self.trajectory_scorer, model, tokenizer)

    def steps_of(self, completion: str) -> tuple[list[str], str, bool]:
        """(the steps to score, the response, whether the completion has a thinking trajectory)."""
        trajectory, response = split_trajectory(completion, self.trajectory_split, self.think_open, self.think_close)
        text = trajectory if trajectory else response
        spans = split_steps(text, self.split, self.tag_pattern)
        if len(spans) > self.max_steps:
            spans = [*spans[: self.max_steps - 1], (spans[self.max_steps - 1][0], spans[-1][1])]
        return [text[a:b] for a, b in spans], response, bool(trajectory)

    def outcome(self, correct: float) -> float:
        return 2.0 * correct - 1.0 if self.outcome_scale == "signed" else correct

    def _steps_scored(self, questions, steps_lists, responses) -> list[list[float] | None]:
        scorer = self.step_scorer
        try:
            if hasattr(scorer, "score_trajectories"):
                return list(scorer.score_trajectories(questions, steps_lists, responses))
            if hasattr(scorer, "score_batch"):
                return list(scorer.score_batch(questions, steps_lists))
        except Exception as e:  # the batch failed: score row by row so one bad row fails alone
            log.warning("reward TrajectoryPRMReward: batched step scoring failed (%r); scoring row by row", e)
        out = []
        for q, s, r in zip(questions, steps_lists, responses):
            try:
                if hasattr(scorer, "score_trajectories"):
                    out.append(scorer.score_trajectories([q], [s], [r])[0])
                elif hasattr(scorer, "score_steps"):
                    out.append(scorer.score_steps(q, s))
                else:
                    out.append(scorer.score_batch([q], [s])[0])
            except Exception as e:
                log.warning("reward TrajectoryPRMReward failed on a row: %r", e)
                out.append(None)
        return out

    def _trajectory_scored(self, samples: list[Sample], questions, responses) -> list[float | None]:
        if self.trajectory_scorer is None:  # the step scorer on the whole completion as one step (released RL code)
            texts = [s.completion.strip() if self.trajectory_input == "full" else r for s, r in zip(samples, responses)]
            rows = [[t] if t else [] for t in texts]
            got = self._steps_scored(questions, rows, responses)
            return [g[0] if g is not None and len(g) == 1 else None for g in got]
        fed = samples
        if self.trajectory_input == "response":
            fed = [dataclasses.replace(s, completion=r, completion_ids=None) for s, r in zip(samples, responses)]
        try:
            res = self.trajectory_scorer(fed)
        except Exception as e:
            log.warning("reward TrajectoryPRMReward: trajectory scoring failed on a batch of %d: %r", len(fed), e)
            return [None] * len(fed)
        fails = res.failures or [False] * len(fed)
        return [None if f else float(v) for v, f in zip(res.scores, fails)]

    @staticmethod
    def _finite(values) -> bool:
        return all(isinstance(x, (int, float)) and math.isfinite(x) for x in values)

    def __call__(self, samples: list[Sample]) -> TermResult:
        n = len(samples)
        if not n:
            return TermResult([], [])
        checked = self.verifier(samples)
        vfail = checked.failures or [False] * n
        outcomes = [self.outcome(float(v)) for v in checked.scores]
        questions = [str(s.record.get(self.question_key, s.prompt)) if s.record else s.prompt for s in samples]
        parts = [self.steps_of(s.completion) for s in samples]
        keys = [pair_key(q, s.completion) for q, s in zip(questions, samples)]
        found: list = [self.cache.get(k) for k in keys]
        hits = sum(v is not LRUCache.MISS and v is not None for v in found)
        todo: dict[str, list[int]] = {}
        blank = [not p[0] for p in parts]  # nothing to score (a blank completion): the PRM does not apply
        for i, v in enumerate(found):
            if blank[i]:
                found[i] = ([], 0.0)
            elif v is LRUCache.MISS:
                todo.setdefault(keys[i], []).append(i)
        if todo:
            firsts = [rows[0] for rows in todo.values()]
            steps = self._steps_scored(
                [questions[i] for i in firsts], [parts[i][0] for i in firsts], [parts[i][1] for i in firsts]
            )
            whole = self._trajectory_scored(
                [samples[i] for i in firsts], [questions[i] for i in firsts], [parts[i][1] for i in firsts]
            )
            for (key, rows), i, st, tr in zip(todo.items(), firsts, steps, whole):
                ok = st is not None and len(st) == len(parts[i][0]) and self._finite(st)
                ok = ok and tr is not None and math.isfinite(tr)
                value = ([float(x) for x in st], float(tr)) if ok else None
                if ok:
                    self.cache.put(key, value)
                for j in rows:
                    found[j] = value
            hits += sum(len(rows) - 1 for rows in todo.values())  # the same completion twice: scored once
        scores, failures = [], []
        prm, step_part, traj_part, n_steps = [], [], [], 0
        for i in range(n):
            got = found[i]
            if got is None:
                scores.append((1.0 - self.beta) * outcomes[i])
                failures.append(True)
                continue
            if blank[i]:
                scores.append((1.0 - self.beta) * outcomes[i])
                failures.append(bool(vfail[i]))
                continue
            st, tr = got
            mean_step = sum(st) / len(st)
            r_hat = mean_step + self.alpha * tr
            prm.append(r_hat)
            step_part.append(mean_step)
            traj_part.append(tr)
            n_steps += len(st)
            scores.append((1.0 - self.beta) * outcomes[i] + self.beta * r_hat)
            failures.append(bool(vfail[i]))
        scored = len(prm)
        metrics = {
            "prm_mean": sum(prm) / scored if scored else 0.0,
            "step_mean": sum(step_part) / scored if scored else 0.0,
            "trajectory_mean": sum(traj_part) / scored if scored else 0.0,
            "outcome_mean": sum(outcomes) / n,
            "steps_mean": n_steps / scored if scored else 0.0,
            "thinking_frac": sum(p[2] for p in parts) / n,
            "prm_scored_frac": scored / n,
            "cache_hits": float(hits),
        }
        return TermResult(scores, failures, missing=blank, metrics=metrics)
