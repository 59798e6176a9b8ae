"""AT-GRPO's tree rollout: turn-wise candidate groups of multi-turn episodes ("Stronger Together: On-Policy
Reinforcement Learning for Collaborative LLMs", Zhao et al., 2025, arXiv 2510.11062; released code
pettingllms-ai/PettingLLMs, ``pettingllms/trainer/multi_agents_execution_engine.py``: ``generate_env_idx_rollout``;
the groups in ``pettingllms/trainer/multi_agents_ppo_trainer.py``: ``_assign_consistent_uids``).

Each prompt's episode unrolls as one shared path. At turn t, K candidate actions are sampled from the path's state
(the prompt, then the chosen turns and the environment's observations so far, as token ids); each candidate is
stepped in its own copy of the environment and scored; the best (greedy by the score, the first of ties) joins the
path, every copy takes on the chosen state, and the episode goes on from there until the environment says done, the
turn limit or the token budget (as ``rlexp.rollout.multi_turn``, whose engine, observation rendering and budgets it
shares).

Rows: the K candidates of every turn, turn-major within a prompt, so ``trainer.num_generations`` G = K ×
``max_turns`` (``candidates`` K; null: G / max_turns). Row (t, k) is the path's tokens before turn t (chosen turns
and observations: attended to, out of the loss — ``policy_tokens`` 0, as the environment's tokens of a multi-turn
row) followed by candidate k's turn (its policy tokens). Every sampled action is thus trained exactly once, in its
own row, with its own context. Turns the episode never reached are empty rows (no tokens, so no loss; the reward
terms score them as an empty episode). Each row's episode record (``record["episode"]``) is the episode as it stands
after its candidate — the path's turns, rewards and counters, then the candidate's — so the reward terms score each
candidate by the state it reached (the release's ``calculate_reward(env)`` after each agent's step), and its
``slot`` = {turn, candidate, agent, chosen, done} names its (turn, agent) group for the advantage
(``rlexp.algorithms.advantages.agent_turn``; empty rows: turn −1). The row's text is the path's policy turns and
the candidate's, joined by newlines (as a multi-turn row's).

One agent here: the release's multi-agent workflows (a coder and a unit-tester, a tool agent and a planner, each
acting at every turn with its own prompt and reward) are not built; with one role the (turn, agent) group is the
turn group and ``slot["agent"]`` is 0.

Selection (``select``): ``reward`` (default; the release's ``if_greedy``) — the run's reward terms (handed over by
the trainer through ``bind_reward_terms``) on the K candidate rows, Σ weight · score; ``environment`` — the
environment's reward for the candidate's turn (a game's score increase); ``first`` — candidate 0 (the release's
``if_greedy=false``). Without bound terms ``reward`` falls back to ``environment`` (a warning, once).

Environment copies: the release deep-copies its environments; ours may hold a process (a TextWorld game), so a
copy is a fresh episode of the same record replayed with the chosen actions (``fork()`` when the episode object has
one) — right for deterministic environments (TextWorld's games, tool calls of pure code).

Only training uses the tree: a greedy call, or one without records (evaluation), rolls out plain multi-turn
episodes (the release validates with single rollouts too).

Metrics: ``episode/*`` over the chosen paths (as ``rlexp.rollout.multi_turn``), ``turn_groups/candidates`` (K),
``turn_groups/empty_frac`` (rows of turns never reached), ``turn_groups/select_score`` (mean score of the chosen
candidates), ``turn_groups/select_gain`` (mean over the turn groups of the best score minus the group's mean: what the
greedy pick gains), ``turn_groups/varied_frac`` (turn groups whose candidates' scores differ)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from rlexp.environments import EnvStep
from rlexp.rewards.terms import Sample
from rlexp.rollout.hf import RolloutOutput
from rlexp.rollout.multi_turn import Episode, MultiTurnRollout, _left_pad, episode_metrics, state_key

log = logging.getLogger(__name__)

SELECTS = ("reward", "environment", "first")


@dataclass
class Candidate:
    """One sampled action of a turn group: its tokens, sampling log-probs, text, and the environment's answer (None:
    the turn hit its token limit and was never answered)."""

    tokens: list[int]
    logprobs: list[float]
    text: str
    step: EnvStep | None


def candidate_row(path: Episode, cand: Candidate, turn: int, max_turns: int) -> Episode:
    """The row of ``cand``: the path's tokens as context (policy 0), then the candidate's turn (policy 1); its episode
    fields are the path's, then the candidate's (see module doc)."""
    n = len(path.tokens)
    row = Episode(
        path.prompt_ids,
        tokens=list(path.tokens),
        policy=[0] * n,
        logprobs=[0.0] * n,
        texts=[*path.texts, cand.text],
        rewards=list(path.rewards),
        turn_ends=list(path.turn_ends),
        counters=dict(path.counters),
        states=[*path.states, path.anchor],
        infos=[dict(i) for i in path.infos],
    )
    row.add(cand.tokens, policy=True, logprobs=cand.logprobs)
    if cand.step is None:
        row.done = row.truncated = True
        return row
    row.turn_ends.append(len(row.tokens) - 1)
    row.rewards.append(float(cand.step.reward))
    row.infos.append(dict(cand.step.info))
    for key, v in cand.step.info.items():
        row.counters[key] = row.counters.get(key, 0) + v
    row.done = bool(cand.step.done) or cand.step.observation is None
    row.turn_limit = not row.done and turn == max_turns - 1
    return row


def pick(scores: list[float], select: str) -> int:
    """The chosen candidate: the first of the best scores (``first``: candidate 0)."""
    if select == "first":
        return 0
    best = max(scores)
    return next(k for k, s in enumerate(scores) if s == best)


def _close(env) -> None:
    close = getattr(env, "close", None)
    if callable(close):
        close()


class TurnGroupRollout(MultiTurnRollout):
    """AT-GRPO's tree rollout over ``environment`` (see module doc): K = ``candidates`` (null: trainer.num_generations
    / ``max_turns``) actions sampled per turn from the shared state, the best by ``select`` (reward | environment |
    first) continues; one row per (turn, candidate). The other settings are ``rlexp.rollout.multi_turn``'s."""

    def __init__(
        self,
        engine,
        environment,
        max_turns: int = 4,
        max_turn_tokens: int | None = None,
        max_episode_tokens: int | None = None,
        candidates: int | None = None,
        select: str = "reward",
    ):
        super().__init__(engine, environment, max_turns, max_turn_tokens, max_episode_tokens)
        if candidates is not None and candidates < 2:
            raise ValueError(
                f"rollout.candidates must be >= 2 (or null: trainer.num_generations / max_turns), got {candidates}"
            )
        if select not in SELECTS:
            raise ValueError(f"rollout.select={select!r} is not one of {list(SELECTS)}")
        self.candidates, self.select = candidates, select
        self.reward_terms: dict | None = None
        self._warned = False

    def bind_reward_terms(self, terms: dict) -> None:
        """The run's reward terms, which score the candidates under ``select=reward`` (the trainer hands them over)."""
        self.reward_terms = dict(terms)

    def group_size(self, num_generations: int) -> int:
        """K, the candidates per turn, from G = ``num_generations`` rows per prompt: G = K × max_turns."""
        T = self.max_turns
        K = self.candidates or num_generations // T
        if K < 2 or K * T != num_generations:
            raise ValueError(
                f"rollout=turn_groups: trainer.num_generations={num_generations} must be rollout.candidates (K >= 2, "
                f"got {self.candidates}) x rollout.max_turns ({T}): one row per turn and candidate"
            )
        return K

    @torch.no_grad()
    def generate(
        self,
        model,
        tokenizer,
        prompts: list[str],
        num_generations: int = 1,
        greedy: bool = False,
        max_new_tokens: int | None = None,
        records: list[dict] | None = None,
        **kw,
    ) -> RolloutOutput:
        """Training (sampled, with records): the tree's rows, G = K × max_turns per prompt (record-major, turn-major
        within a prompt). Greedy or without records (evaluation): plain multi-turn episodes."""
        if greedy or records is None:
            return super().generate(model, tokenizer, prompts, num_generations, greedy, max_new_tokens, records, **kw)
        K, T = self.group_size(num_generations), self.max_turns
        budget, turn_budget = self._budgets(max_new_tokens)
        device = next(model.parameters()).device
        pad = tokenizer.pad_token_id
        paths = [Episode(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        envs = [[self.environment(r) for _ in range(K)] for r in records]
        actions: list[list[str]] = [[] for _ in prompts]  # the chosen turns' texts, replayed into fresh copies
        for i, path in enumerate(paths):
            self._open(tokenizer, path, envs[i][0], prompts[i])  # the path's; the candidates' copies start alike
            for env in envs[i][1:]:
                env.reset()
        rows: list[list[tuple[Episode, dict] | None]] = [[None] * (K * T) for _ in prompts]
        chosen_scores, gains, varied = [], [], []
        for turn in range(T):
            active = [i for i, p in enumerate(paths) if not p.done]
            if not active:
                break
            room = max(budget - len(paths[i].tokens) for i in active)
            ids, mask = _left_pad(
                [paths[i].prompt_ids + paths[i].tokens for i in active for _ in range(K)], pad, device
            )
            out = self.engine.generate_from_ids(model, tokenizer, ids, mask, min(turn_budget, room), greedy=False)
            for a, i in enumerate(active):
                path = paths[i]
                cands = []
                for k in range(K):
                    r = a * K + k
                    n = int(out.completion_mask[r].sum())
                    left = budget - len(path.tokens)
                    cut = n > left
                    n = min(n, left)
                    toks = out.completion_ids[r, :n].tolist()
                    text = tokenizer.decode(toks, skip_special_tokens=True) if cut else out.texts[r]
                    answered = not (cut or bool(out.truncated[r]))
                    step = envs[i][k].step(text) if answered else None
                    cands.append(Candidate(toks, out.logprobs[r, :n].float().tolist(), text, step))
                turn_rows = [candidate_row(path, c, turn, T) for c in cands]
                scores = self._scores(prompts[i], records[i], i, turn_rows, cands)
                best = pick(scores, self.select)
                for k, row in enumerate(turn_rows):
                    slot = {"turn": turn, "candidate": k, "agent": 0, "chosen": k == best, "done": row.done}
                    rows[i][turn * K + k] = (row, slot)
                mean = sum(scores) / K
                chosen_scores.append(scores[best])
                gains.append(max(scores) - mean)
                varied.append(float(max(scores) > min(scores)))
                self._advance(tokenizer, path, cands[best], turn, budget)
                actions[i].append(cands[best].text)
                keep = envs[i][best]
                for k, env in enumerate(envs[i]):
                    if k != best or path.done:
                        _close(env)
                if not path.done:  # every copy takes on the chosen state
                    envs[i] = [keep] + [self._copy(keep, records[i], actions[i]) for _ in range(K - 1)]
        flat, slots = [], []
        for i, path in enumerate(paths):
            for j in range(K * T):
                entry = rows[i][j]
                if entry is None:  # a turn the episode never reached: an empty row
                    empty = {"turn": -1, "candidate": j % K, "agent": 0, "chosen": False, "done": True}
                    entry = (Episode(path.prompt_ids), empty)
                flat.append(entry[0])
                slots.append(entry[1])
        out = self._output(tokenizer, flat, device)
        out.episodes = [{**rec, "slot": slot} for rec, slot in zip(out.episodes, slots)]
        n_groups = max(1, len(chosen_scores))
        out.stats = {
            **episode_metrics(paths),
            "turn_groups/candidates": float(K),
            "turn_groups/empty_frac": sum(s["turn"] < 0 for s in slots) / max(1, len(slots)),
            "turn_groups/select_score": sum(chosen_scores) / n_groups,
            "turn_groups/select_gain": sum(gains) / n_groups,
            "turn_groups/varied_frac": sum(varied) / n_groups,
        }
        return out

    def _advance(self, tokenizer, path: Episode, cand: Candidate, turn: int, budget: int) -> None:
        """The chosen candidate joins the path (as a multi-turn episode's turn, with its observation after it)."""
        path.states.append(path.anchor)
        path.add(cand.tokens, policy=True, logprobs=cand.logprobs)
        path.texts.append(cand.text)
        step = cand.step
        if step is None:
            path.done = path.truncated = True
            return
        path.turn_ends.append(len(path.tokens) - 1)
        path.rewards.append(float(step.reward))
        path.infos.append(dict(step.info))
        for key, v in step.info.items():
            path.counters[key] = path.counters.get(key, 0) + v
        if step.done or step.observation is None:
            path.done = True
        elif turn == self.max_turns - 1:
            path.done = path.turn_limit = True
        else:
            obs = self._observation_ids(tokenizer, step.observation)
            if len(path.tokens) + len(obs) >= budget:  # no room for the observation and a turn after it
                path.done = path.truncated = True
            else:
                path.add(obs, policy=False)
                path.anchor = state_key(step.observation)

    def _copy(self, env, record: dict, actions: list[str]):
        """An independent copy of ``env`` in its current state: ``env.fork()`` if it has one, else a fresh episode of
        ``record`` replayed with the chosen ``actions``."""
        fork = getattr(env, "fork", None)
        if callable(fork):
            return fork()
        fresh = self.environment(record)
        fresh.reset()
        for a in actions:
            fresh.step(a)
        return fresh

    def _scores(self, prompt: str, record: dict, group: int, rows: list[Episode], cands: list[Candidate]):
        """The K candidates' scores: the run's reward (``select`` reward or first, with bound terms) or the
        environment's reward for the turn."""
        terms = self.reward_terms
        if self.select == "environment" or not terms:
            if self.select == "reward" and not self._warned:
                log.warning("rollout=turn_groups: no reward terms bound; candidates are picked by environment reward")
                self._warned = True
            return [float(c.step.reward) if c.step is not None else 0.0 for c in cands]
        samples = [
            Sample(
                prompt,
                "\n".join(row.texts),
                {**record, "episode": row.record()},
                group,
                len(row.tokens),
                bool(row.truncated),
                list(row.tokens),
            )
            for row in rows
        ]
        total = [0.0] * len(rows)
        for term in terms.values():
            for k, s in enumerate(term(samples).scores):
                v = float(s) if s is not None else 0.0
                total[k] += term.weight * (v if math.isfinite(v) else 0.0)
        return total
