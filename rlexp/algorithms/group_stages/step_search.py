"""StepSearch's step-wise rewards of search episodes ("StepSearch: Igniting LLMs Search Ability via Step-Wise
Proximal Policy Optimization", Wang, Zheng, An et al., EMNLP 2025, arXiv 2505.15107; released code
Zillwang/StepSearch, ``verl/utils/reward_score/qa_step.py`` and ``verl/trainer/main_ppo.py``), as a group stage of
multi-turn episodes with the retrieval tool (``rollout=multi_turn environment=tool_use tools=[retrieval]``).

An episode's search steps are its policy turns whose observation (the environment's tokens after the turn, decoded)
holds retrieved documents (``rlexp.tools.retrieval.parse_results``); the record's supporting documents
(``metadata.supporting_docs``: ``{"id", "title", "text"}``, as ``dataset=search_facts`` writes them — the release's
``extra_info.support_docs``) are the gold evidence g_1..g_n. For step t with retrieved documents D_t:

* information gain — c_{t,i} = max_{d∈D_t} cos_tfidf(d, g_i), the TF-IDF cosine of the document's text and gold
  document i (each pair vectorised on its own, as the release's ``subm_tfidf_cosine``: scikit-learn's
  ``TfidfVectorizer`` defaults — tokens ``\\b\\w\\w+\\b``, idf = ln((1 + m) / (1 + df)) + 1 over the m texts, l2
  norm — after SQuAD normalisation); the memory m_{t,i} = max(m_{t−1,i}, c_{t,i}), m_0 = 0; the gain
  G_t = (1/n) Σ_i max(c_{t,i} − m_{t−1,i}, 0): how much of the gold evidence this step covers beyond the earlier ones;
* redundancy penalty — P_t = |{d ∈ D_t already retrieved, in an earlier step or earlier in this one}| / |D_t|;
* the step reward s_t = scale · (G_t − P_t) (``step_reward_scale`` 0.6, the release's reward manager), paid at the
  step's last policy token (``emit: token``, for GAE with a critic: StePPO) or as turn t's reward (``emit: turn``,
  for the group-baseline turn-level advantage ``advantages.turn_level``, whose last turn gets the outcome).

The outcome is the run's reward (``reward=search_qa``: the answer's token F1, −1 when the response does not end
with ``<answer>…</answer>`` — the release's ``answer_last_check``) plus ``key_weight`` (0.618) × the search-key
score, a reward column ``search_key``: the mean over the record's sub-question keys (``metadata.search_keys``: one
list of equivalent expressions per hop) of the best token F1 of any of the episode's queries against that key's
expressions (the release overwrites a key's match by the latest query that matches it best; we keep the best).
With ``require_answer`` (the release) a row that does not end with its answer gets no step rewards and no key
score.

Metrics (over the step's search steps, before the answer gate): ``stepsearch/info_gain_mean`` (mean G_t),
``stepsearch/redundancy_mean`` (mean P_t), ``stepsearch/step_reward_mean`` (mean s_t paid, after the gate),
``stepsearch/search_steps`` (per episode), ``stepsearch/coverage`` (mean final memory Σ_i m_{T,i} / n: how much of
the gold evidence the episode retrieved), ``stepsearch/key_score_mean``, ``stepsearch/answered_frac``."""

from __future__ import annotations

import math
import re
from collections import Counter

import torch

from rlexp.algorithms.advantages.turn_level import turn_index
from rlexp.algorithms.group_stages.base import append_reward_column
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import POLICY_TOKENS, TOKEN_REWARDS, TURN_REWARDS
from rlexp.core.registry import GROUP_STAGES
from rlexp.rewards.search import ends_with_answer, normalize_answer, token_f1
from rlexp.tools.calls import parse_calls
from rlexp.tools.retrieval import parse_results

EMITS = ("token", "turn")
_TFIDF_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def tfidf_cosines(text: str, golds: list[str]) -> list[float]:
    """The TF-IDF cosine of ``text`` and each gold text, vectorised over the 1 + n texts together (scikit-learn's
    ``TfidfVectorizer`` defaults: smooth idf ln((1 + m) / (1 + df)) + 1, raw counts, l2 norm), after SQuAD
    normalisation; 0 for an empty text."""
    texts = [normalize_answer(t) for t in [text, *golds]]
    if not texts[0]:
        return [0.0] * len(golds)
    counts = [Counter(_TFIDF_TOKEN.findall(t)) for t in texts]
    m = len(texts)
    df = Counter(tok for c in counts for tok in c)
    idf = {tok: math.log((1 + m) / (1 + d)) + 1.0 for tok, d in df.items()}
    vecs = []
    for c in counts:
        v = {tok: n * idf[tok] for tok, n in c.items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        vecs.append({tok: x / norm for tok, x in v.items()} if norm > 0 else {})
    q = vecs[0]
    return [sum(x * g.get(tok, 0.0) for tok, x in q.items()) for g in vecs[1:]]


def information_gains(steps: list[list[str]], golds: list[str]) -> tuple[list[float], list[float]]:
    """(G_t per step, the final memory m_T per gold document): each step's documents' coverage of the gold texts
    beyond the earlier steps' (see module doc). ``steps``: the documents' texts of each search step."""
    memory = [0.0] * len(golds)
    gains = []
    for docs in steps:
        current = [0.0] * len(golds)
        for d in docs:
            current = [max(c, s) for c, s in zip(current, tfidf_cosines(d, golds))]
        gains.append(sum(max(c - p, 0.0) for c, p in zip(current, memory)) / len(golds) if golds else 0.0)
        memory = [max(c, p) for c, p in zip(current, memory)]
    return gains, memory


def redundancy_penalties(steps: list[list]) -> list[float]:
    """P_t: the share of step t's documents retrieved before (in an earlier step, or earlier in step t)."""
    seen, out = set(), []
    for docs in steps:
        repeated = 0
        for d in docs:
            repeated += d in seen
            seen.add(d)
        out.append(repeated / len(docs) if docs else 0.0)
    return out


def search_key_score(queries: list[str], keys: list[list[str]]) -> float:
    """The mean over the keys (each a list of equivalent expressions) of the best token F1 of a query against it."""
    if not queries or not keys:
        return 0.0
    return sum(max(token_f1(q, [str(e) for e in k]) for q in queries) for k in keys) / len(keys)


class _QueryArgument:
    tag_argument = "query"


def episode_queries(text: str, tool_name: str = "search") -> list[str]:
    """The queries of the ``tool_name`` calls in a policy's text, in either call format (json or tags)."""
    tools = {tool_name: _QueryArgument()}
    out = []
    for fmt in ("json", "tags"):
        for call in parse_calls(text, fmt, tools):
            q = call.arguments.get("query") if call.error is None and call.name == tool_name else None
            if isinstance(q, str) and q.strip():
                out.append(q.strip())
    return out


def turn_spans(policy_tokens: torch.Tensor, completion_mask: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Each row's turns as (first, last) completion indices of their policy tokens."""
    idx = turn_index(policy_tokens, completion_mask).cpu()
    spans = []
    for row in idx:
        found: dict[int, list[int]] = {}
        for pos in (row >= 0).nonzero().squeeze(-1).tolist():
            k = int(row[pos])
            if k in found:
                found[k][1] = pos
            else:
                found[k] = [pos, pos]
        spans.append([tuple(found[k]) for k in sorted(found)])
    return spans


def supporting_docs(record: dict) -> list[dict]:
    meta = record.get("metadata") or {}
    docs = record.get("supporting_docs", meta.get("supporting_docs")) or []
    return [d if isinstance(d, dict) else {"text": str(d)} for d in docs]


def search_keys(record: dict) -> list[list[str]]:
    meta = record.get("metadata") or {}
    keys = record.get("search_keys", meta.get("search_keys")) or []
    return [[str(e) for e in (k if isinstance(k, (list, tuple)) else [k])] for k in keys]


@GROUP_STAGES.register
class StepSearch:
    """Group stage: StepSearch's step rewards — information gain minus redundancy penalty per search step — and the
    search-key reward (see module doc). Needs ``rollout=multi_turn`` with the retrieval tool. Settings:
    ``information_gain`` / ``redundancy_penalty`` (each part on or off, the release's switches),
    ``step_reward_scale``, ``key_weight`` (0: no key reward), ``require_answer``, ``emit`` token | turn,
    ``tool_name``."""

    def __init__(
        self,
        information_gain: bool = True,
        redundancy_penalty: bool = True,
        step_reward_scale: float = 0.6,
        key_weight: float = 0.618,
        require_answer: bool = True,
        emit: str = "token",
        tool_name: str = "search",
    ):
        if emit not in EMITS:
            raise ValueError(f"algorithm.group_stages: StepSearch.emit={emit!r} is not one of {list(EMITS)}")
        if step_reward_scale < 0 or key_weight < 0:
            raise ValueError(
                f"algorithm.group_stages: StepSearch.step_reward_scale ({step_reward_scale}) and key_weight "
                f"({key_weight}) must be >= 0"
            )
        self.gain_on, self.penalty_on = bool(information_gain), bool(redundancy_penalty)
        self.scale, self.key_weight = float(step_reward_scale), float(key_weight)
        self.require_answer, self.emit, self.tool_name = bool(require_answer), emit, tool_name

    def step_scores(self, steps: list[list[tuple[str, str]]], golds: list[str]) -> tuple[list[float], ...]:
        """(G_t, P_t, s_t, final memory m_T) of an episode's search steps (documents as (title, text)) against the
        gold texts."""
        gains, memory = information_gains([[text for _, text in docs] for docs in steps], golds)
        penalties = redundancy_penalties(steps)
        scores = [self.scale * (g * self.gain_on - p * self.penalty_on) for g, p in zip(gains, penalties)]
        return gains, penalties, scores, memory

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        policy = batch.extras.get(POLICY_TOKENS)
        if policy is None:
            raise ValueError(
                "algorithm.group_stages: StepSearch needs multi-turn search episodes, and this batch has none (no "
                "batch.extras['policy_tokens']): set rollout=multi_turn environment=tool_use tools=[retrieval]"
            )
        n = len(batch)
        spans = turn_spans(policy, batch.completion_mask)
        ids = batch.completion_ids.cpu()
        fmt = getattr(ctx, "answer_format", "tag")
        step_rewards: list[list[tuple[int, float]]] = []  # per row: (turn, s_t)
        keys_scored, key_scores = [], torch.zeros(n)
        all_gains, all_penalties, paid, coverage, answered, searches = [], [], [], [], 0, 0
        for i in range(n):
            record = batch.records[i] if i < len(batch.records) else {}
            record = record or {}
            turns = spans[i]
            steps, step_turns = [], []
            for k in range(len(turns) - 1):  # the observation between turn k and turn k + 1
                obs = ctx.tokenizer.decode(ids[i, turns[k][1] + 1 : turns[k + 1][0]].tolist(), skip_special_tokens=True)
                docs = parse_results(obs)
                if docs:
                    steps.append(docs)
                    step_turns.append(k)
            searches += len(steps)
            golds = [str(d.get("text", "")) for d in supporting_docs(record)]
            ok = ends_with_answer(batch.completions[i], fmt)
            answered += ok
            rows = []
            if golds and steps:
                gains, penalties, scores, memory = self.step_scores(steps, golds)
                all_gains += gains
                all_penalties += penalties
                coverage.append(sum(memory) / len(memory))
                if ok or not self.require_answer:
                    rows = list(zip(step_turns, scores))
                    paid += scores
            elif golds:
                coverage.append(0.0)
            step_rewards.append(rows)
            keys = search_keys(record)
            if keys:
                score = search_key_score(episode_queries(batch.completions[i], self.tool_name), keys)
                keys_scored.append(score)
                key_scores[i] = score if (ok or not self.require_answer) else 0.0
        if self.key_weight > 0:
            batch = append_reward_column(batch, "search_key", key_scores, self.key_weight)
        device = batch.completion_mask.device
        if self.emit == "token":
            extra = torch.zeros(batch.completion_mask.shape, dtype=torch.float32)
            for i, rows in enumerate(step_rewards):
                for k, s in rows:
                    extra[i, spans[i][k][1]] += s
            prev = batch.extras.get(TOKEN_REWARDS)
            extra = extra.to(device)
            batch.extras[TOKEN_REWARDS] = extra if prev is None else prev.float() + extra
        else:
            width = max([1] + [len(s) for s in spans])
            turn_r = torch.full((n, width), float("nan"))
            outcome = batch.reward.float().cpu()
            for i, rows in enumerate(step_rewards):
                t = len(spans[i])
                if t == 0:
                    continue
                turn_r[i, :t] = 0.0
                for k, s in rows:
                    turn_r[i, k] += s
                turn_r[i, t - 1] += outcome[i]
            batch.extras[TURN_REWARDS] = turn_r.to(device)
        st = batch.stats
        st["stepsearch/info_gain_mean"] = sum(all_gains) / len(all_gains) if all_gains else 0.0
        st["stepsearch/redundancy_mean"] = sum(all_penalties) / len(all_penalties) if all_penalties else 0.0
        st["stepsearch/step_reward_mean"] = sum(paid) / len(paid) if paid else 0.0
        st["stepsearch/search_steps"] = searches / max(1, n)
        st["stepsearch/coverage"] = sum(coverage) / len(coverage) if coverage else 0.0
        st["stepsearch/key_score_mean"] = sum(keys_scored) / len(keys_scored) if keys_scored else 0.0
        st["stepsearch/answered_frac"] = answered / max(1, n)
        return batch
