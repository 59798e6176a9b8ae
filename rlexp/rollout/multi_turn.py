"""Multi-turn rollouts (issue 28): an episode is the prompt, then policy turns and environment turns in turn, under
the chat template, until the environment says done (a turn without a tool call: the final answer), the turn limit
or the episode's token budget.

The episode is one completion row of the batch: its tokens after the prompt are the policy's sampled turns and the
environment's rendered observations, all attended to (``completion_mask``), but only the policy's enter the loss —
the rollout returns ``policy_tokens`` (1 on policy tokens, 0 on environment tokens), which the trainer puts in
``batch.extras["policy_tokens"]`` (``rlexp.core.masks``: out of the loss and of the train-inference mismatch) — and
their sampling log-probs are kept per turn (0 on environment tokens). Groups are G episodes of the same task, as
single-turn groups are G completions.

Each turn, the active episodes' contexts (prompt + everything so far, as token ids: sampled tokens are never
re-tokenised) are continued by the base engine (``HFRollout.generate_from_ids``); a turn ends at EOS (the end of the
assistant message). An observation o is rendered as the chat template renders a message of the environment's role
after an assistant message, plus the generation prompt of the next assistant turn (``observation_template``); a
template that refuses the role falls back to ``user``.

The batch's text of a row (what the reward terms read) is the policy's turns joined by newlines — never the
environment's text, so a tool's output cannot put an answer in the policy's mouth. Each row's episode record
(``episodes``: turns, per-turn rewards and their token positions, counters) reaches the reward terms as
``record["episode"]`` (``rlexp.rewards.environment``).

Anchor states (GiGPO's step groups, ``rlexp.algorithms.advantages.step_groups``): ``record["episode"]["states"]``
holds, for each policy turn, a hash of what the environment showed just before it (``state_key``): the prompt
(with the environment's first observation, if any) before the first turn, the last observation before the others.
``record["episode"]["turn_infos"]`` holds each answered turn's own info (the environment's counters for that turn:
an invalid command, a tool error; SPA-RL's grounding signal, ``rlexp.algorithms.group_stages.progress``).

Metrics (means over the step's episodes): ``episode/turns``, ``episode/tool_calls``, ``episode/tool_errors``,
``episode/malformed_calls``, ``episode/env_reward``, ``episode/length`` (tokens after the prompt),
``episode/policy_tokens``, ``episode/turn_limit_frac``, ``episode/truncated_frac``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from rlexp.rollout.hf import RolloutOutput

_MARK = "\x00OBSERVATION\x00"
COUNTERS = ("tool_calls", "tool_errors", "malformed_calls")  # an episode's counters, 0 when its environment kept none


def state_key(text: str) -> str:
    """An anchor state's key: the first 16 hex digits of the SHA-1 of the text the environment showed."""
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:16]


def observation_template(tokenizer, role: str) -> tuple[str, str]:
    """(before, after): an observation ``o`` that follows a policy turn ending in EOS is ``before + o + after``, as
    the chat template renders a ``role`` message after an assistant message, then the next assistant header."""
    msgs = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    for r in dict.fromkeys((role, "user")):
        try:
            base = tokenizer.apply_chat_template(msgs, tokenize=False)
            full = tokenizer.apply_chat_template(
                msgs + [{"role": r, "content": _MARK}], tokenize=False, add_generation_prompt=True
            )
        except Exception:  # a template that refuses the role (or has none)
            continue
        if not full.startswith(base) or _MARK not in full:
            continue
        tail = base[base.rindex("A") + 1 :]  # what closes the assistant message: EOS and what follows it
        eos = tokenizer.eos_token or ""
        if eos and tail.startswith(eos):  # the policy's turn already ended with its EOS token
            tail = tail[len(eos) :]
        before, after = full[len(base) :].split(_MARK, 1)
        return tail + before, after
    return f"\n{role}: ", "\n"


@dataclass
class Episode:
    """One row's episode as it unrolls."""

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    policy: list[int] = field(default_factory=list)  # 1: a policy token
    logprobs: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the policy's turns
    rewards: list[float] = field(default_factory=list)  # per turn
    turn_ends: list[int] = field(default_factory=list)  # the completion index of each turn's last policy token
    counters: dict = field(default_factory=dict)
    done: bool = False
    truncated: bool = False
    turn_limit: bool = False
    states: list[str] = field(default_factory=list)  # the anchor state before each turn (state_key)
    infos: list[dict] = field(default_factory=list)  # each answered turn's own info (its counters: tool errors, ...)
    anchor: str = ""  # the state the next turn starts from

    def add(self, ids: list[int], policy: bool, logprobs: list[float] | None = None) -> None:
        self.tokens += ids
        self.policy += [int(policy)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def record(self) -> dict:
        return {
            "turns": len(self.texts),
            "rewards": list(self.rewards),
            "reward": float(sum(self.rewards)),
            "turn_ends": list(self.turn_ends),
            "truncated": self.truncated,
            "turn_limit": self.turn_limit,
            **dict.fromkeys(COUNTERS, 0),
            **self.counters,
            "states": list(self.states),
            "turn_infos": [dict(i) for i in self.infos],
        }


class MultiTurnRollout:
    """Episodes of ``max_turns`` policy turns at most against ``environment`` (a factory: record -> episode;
    ``rlexp.environments``), each turn ``max_turn_tokens`` at most, ``max_episode_tokens`` in all (policy and
    environment tokens after the prompt; default the engine's ``max_new_tokens``). ``engine``: the base rollout
    (``rlexp.rollout.hf.HFRollout``) that samples each turn."""

    needs_records = True  # the trainer passes each prompt's record (an environment may be made from it)

    def __init__(
        self,
        engine,
        environment,
        max_turns: int = 4,
        max_turn_tokens: int | None = None,
        max_episode_tokens: int | None = None,
    ):
        if not hasattr(engine, "generate_from_ids"):
            raise ValueError(f"rollout.engine: {type(engine).__name__} cannot continue token contexts (rollout=hf)")
        if max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1, got {max_turns}")
        for key, v in (("max_turn_tokens", max_turn_tokens), ("max_episode_tokens", max_episode_tokens)):
            if v is not None and v < 1:
                raise ValueError(f"rollout.{key} must be >= 1 (or null), got {v}")
        self.engine, self.environment, self.max_turns = engine, environment, max_turns
        self.max_episode_tokens = max_episode_tokens or engine.max_new_tokens
        self.max_turn_tokens = min(max_turn_tokens or self.max_episode_tokens, self.max_episode_tokens)
        self.role = getattr(environment, "role", "user")
        self._templates: dict[int, tuple[str, str]] = {}

    # the trainer's and the evaluation's reads of a rollout
    @property
    def temperature(self) -> float:
        return self.engine.temperature

    @property
    def max_new_tokens(self) -> int:
        return self.max_episode_tokens

    def state_dict(self):
        return self.engine.state_dict() if hasattr(self.engine, "state_dict") else None

    def load_state_dict(self, state) -> None:
        if hasattr(self.engine, "load_state_dict"):
            self.engine.load_state_dict(state)

    def _observation_ids(self, tokenizer, text: str) -> list[int]:
        key = id(tokenizer)
        if key not in self._templates:
            self._templates[key] = observation_template(tokenizer, self.role)
        before, after = self._templates[key]
        return tokenizer(before + text + after, add_special_tokens=False)["input_ids"]

    def _budgets(self, max_new_tokens: int | None) -> tuple[int, int]:
        """(the episode's token budget, a turn's): ``max_new_tokens`` caps ``max_episode_tokens``."""
        budget = min(max_new_tokens or self.max_episode_tokens, self.max_episode_tokens)
        return budget, min(self.max_turn_tokens, budget)

    def _open(self, tokenizer, ep: Episode, env, prompt: str) -> None:
        """Start ``ep`` on ``env``: reset it; the first anchor state is the prompt's (with the environment's first
        observation, if any, which joins the episode as environment tokens)."""
        first = env.reset()
        ep.anchor = state_key(prompt + (first or ""))
        if first is not None:
            ep.add(self._observation_ids(tokenizer, first), policy=False)

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
        **_,
    ) -> RolloutOutput:
        """``num_generations`` episodes of each prompt (record-major, as single-turn rows); ``records``: the prompts'
        records (None: an empty record each, enough for tool use)."""
        G = num_generations
        budget, turn_budget = self._budgets(max_new_tokens)
        records = records if records is not None else [{} for _ in prompts]
        prompt_ids = tokenizer([p for p in prompts for _ in range(G)], add_special_tokens=False)["input_ids"]
        episodes = [Episode(ids) for ids in prompt_ids]
        envs = [self.environment(r) for r in records for _ in range(G)]
        for k, (ep, env) in enumerate(zip(episodes, envs)):
            self._open(tokenizer, ep, env, prompts[k // G])
        device = next(model.parameters()).device
        for turn in range(self.max_turns):
            active = [i for i, ep in enumerate(episodes) if not ep.done]
            if not active:
                break
            out = self._sample_turn(model, tokenizer, [episodes[i] for i in active], turn_budget, budget, greedy)
            for k, i in enumerate(active):
                self._take_turn(tokenizer, episodes[i], envs[i], out, k, budget, last=turn == self.max_turns - 1)
        return self._output(tokenizer, episodes, device)

    def _sample_turn(self, model, tokenizer, eps: list[Episode], turn_budget: int, budget: int, greedy: bool):
        """The next turn of each episode of ``eps`` (one row each): their contexts (prompt + everything so far, as
        ids) continued by the engine, ``turn_budget`` tokens at most and no more than the roomiest episode has left."""
        room = max(budget - len(ep.tokens) for ep in eps)
        device = next(model.parameters()).device
        ids, mask = _left_pad([ep.prompt_ids + ep.tokens for ep in eps], tokenizer.pad_token_id, device)
        return self.engine.generate_from_ids(model, tokenizer, ids, mask, min(turn_budget, room), greedy=greedy)

    def _take_turn(self, tokenizer, ep: Episode, env, out: RolloutOutput, k: int, budget: int, last: bool) -> None:
        """Row ``k`` of the engine's ``out`` as ``ep``'s next turn: its tokens (cut to the episode budget), the
        environment's step on its text, then the observation (or the end: done, the turn limit — ``last`` — or no
        room left)."""
        ep.states.append(ep.anchor)
        n = int(out.completion_mask[k].sum())
        left = budget - len(ep.tokens)
        cut = n > left
        n = min(n, left)
        toks = out.completion_ids[k, :n].tolist()
        ep.add(toks, policy=True, logprobs=out.logprobs[k, :n].float().tolist())
        text = tokenizer.decode(toks, skip_special_tokens=True) if cut else out.texts[k]
        ep.texts.append(text)
        if cut or bool(out.truncated[k]):  # the turn hit its token limit: no complete message to answer
            ep.done = ep.truncated = True
            return
        step = env.step(text)
        ep.turn_ends.append(len(ep.tokens) - 1)
        ep.rewards.append(float(step.reward))
        ep.infos.append(dict(step.info))
        for key, v in step.info.items():
            ep.counters[key] = ep.counters.get(key, 0) + v
        if step.done or step.observation is None:
            ep.done = True
            return
        if last:
            ep.done = ep.turn_limit = True
            return
        obs = self._observation_ids(tokenizer, step.observation)
        if len(ep.tokens) + len(obs) >= budget:  # no room for the observation and a turn after it
            ep.done = ep.truncated = True
            return
        ep.add(obs, policy=False)
        ep.anchor = state_key(step.observation)

    def _output(self, tokenizer, episodes: list[Episode], device) -> RolloutOutput:
        pad = tokenizer.pad_token_id
        p_ids, p_mask = _left_pad([ep.prompt_ids for ep in episodes], pad, device)
        width = max(1, max(len(ep.tokens) for ep in episodes))
        n = len(episodes)
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        policy = torch.zeros((n, width), dtype=torch.float32)
        logprobs = torch.zeros((n, width), dtype=torch.float32)
        for r, ep in enumerate(episodes):
            t = len(ep.tokens)
            ids[r, :t] = torch.tensor(ep.tokens, dtype=torch.long)
            mask[r, :t] = 1
            policy[r, :t] = torch.tensor(ep.policy, dtype=torch.float32)
            logprobs[r, :t] = torch.tensor(ep.logprobs, dtype=torch.float32)
        out = RolloutOutput(
            p_ids,
            p_mask,
            ids.to(device),
            mask.to(device),
            logprobs.to(device),
            torch.tensor([ep.truncated for ep in episodes], device=device),
            ["\n".join(ep.texts) for ep in episodes],
            stats=episode_metrics(episodes),
            policy_tokens=policy.to(device),
            episodes=[ep.record() for ep in episodes],
        )
        return out


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    n = max(1, len(episodes))

    def mean(f) -> float:
        return float(sum(f(ep) for ep in episodes) / n)

    return {
        "episode/turns": mean(lambda ep: len(ep.texts)),
        "episode/tool_calls": mean(lambda ep: ep.counters.get("tool_calls", 0)),
        "episode/tool_errors": mean(lambda ep: ep.counters.get("tool_errors", 0)),
        "episode/malformed_calls": mean(lambda ep: ep.counters.get("malformed_calls", 0)),
        "episode/env_reward": mean(lambda ep: sum(ep.rewards)),
        "episode/length": mean(lambda ep: len(ep.tokens)),
        "episode/policy_tokens": mean(lambda ep: sum(ep.policy)),
        "episode/turn_limit_frac": mean(lambda ep: float(ep.turn_limit)),
        "episode/truncated_frac": mean(lambda ep: float(ep.truncated)),
    }


def _left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        if r:
            ids[k, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[k, width - len(r) :] = 1
    return ids.to(device), mask.to(device)
