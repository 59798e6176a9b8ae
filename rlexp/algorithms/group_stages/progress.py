"""SPA-RL's stepwise progress attribution ("SPA-RL: Reinforcing LLM Agents via Stepwise Progress Attribution", Wang
et al., 2025, arXiv 2505.20732; released code WangHanLinHenry/SPA-RL-Agent: ``prm/train_our_progress_model.py``,
``prm/inference_prm.py``, ``prm/rl_data_org.py``), as a group stage of multi-turn episodes (``rollout=multi_turn``).

A progress estimator gives each turn t of an episode a contribution ĉ_t, trained so that the contributions of an
episode add up to its final outcome R:

    L = mean_i ( Σ_t ĉ_{i,t} − R_i )²                                   (MSE; the release's ``nn.MSELoss``)

and each turn's reward is its contribution plus a grounding signal for an action the environment could execute,

    r_t = α · ĉ_t + β · g_t        g_t = 1 if turn t's action was executable, else 0

(α = ``contribution_weight``, β = ``grounding_weight``; the release adds 0.5 per grounded step, its ALFWorld check
being that the next observation is not "Nothing happens"). The turn rewards go to ``batch.extras["turn_rewards"]``
((N, K), NaN past each row's turns), which the turn-level advantage (``advantages.turn_level``: group-normalised,
summed over the later turns) turns into per-turn advantages. ``batch.reward`` is left as it is (the reward metrics).

The estimator (the release: the SFT policy itself, fully fine-tuned, with a linear head over the logits at the last
token of each assistant turn, trained offline on explored trajectories, then run on those same trajectories) is here
a linear head over the policy's final hidden state (no gradient into the policy; scaled by 1/√d) at the last token
of each turn, zero-initialised, trained online: each step, ``updates`` full-batch Adam steps on the MSE over the
episodes of the last ``buffer_steps`` steps (this one included), then it attributes this step's episodes. A turn is a
run of the policy's tokens (``batch.extras["policy_tokens"]``), as the turn-level advantage counts them.

Grounding g_t reads the environment's own info for turn t (``record["episode"]["turn_infos"]``, rlexp.rollout.
multi_turn): 0 when it counted an invalid command (TextWorld: not among the admissible commands), a tool error or a
malformed call, else 1; a turn cut at the token limit (never answered) gets 0. ``outcome_weight`` > 0 also adds
that share of the outcome to the last turn's reward (0: the paper, whose outcome reaches the policy only through the
contributions).

Metrics: ``spa/estimator_loss`` (the MSE on this step's episodes after the update), ``spa/estimator_loss_before``
(before it: episodes the head has not seen), ``spa/contribution_mean``, ``spa/contribution_std`` (over the step's
turns), ``spa/contribution_sum_mean`` (mean Σ_t ĉ_t per episode: near the mean outcome once fitted),
``spa/grounding_mean`` (share of grounded turns), ``spa/turn_reward_mean``, ``spa/buffer_episodes``."""

from __future__ import annotations

import math
from collections import deque

import torch
from torch import nn

from rlexp.algorithms.advantages.turn_level import turn_index
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import padded_causal_mask, sequence_inputs
from rlexp.core.masks import POLICY_TOKENS, TURN_REWARDS
from rlexp.core.registry import GROUP_STAGES

UNGROUNDED = ("invalid_commands", "tool_errors", "malformed_calls")  # a turn's counters that mean "not executed"


def turn_ends(policy_tokens: torch.Tensor, completion_mask: torch.Tensor) -> list[list[int]]:
    """Each row's completion index of the last token of each turn (a turn: a run of policy tokens)."""
    idx = turn_index(policy_tokens, completion_mask).cpu()
    after = torch.full_like(idx, -1)
    after[:, :-1] = idx[:, 1:]
    ends = (idx >= 0) & (idx != after)
    return [row.nonzero().squeeze(-1).tolist() for row in ends]


def grounding(episode: dict, turns: int) -> list[float]:
    """g_t of an episode's ``turns`` turns from its ``turn_infos``: 1 unless the turn's info counts an invalid
    command, a tool error or a malformed call; 0 for a turn without info (cut at the token limit)."""
    infos = list(episode.get("turn_infos", []))
    return [
        float(not any(float(infos[t].get(k, 0) or 0) > 0 for k in UNGROUNDED)) if t < len(infos) else 0.0
        for t in range(turns)
    ]


def episode_sums(contributions: torch.Tensor, owner: torch.Tensor, episodes: int) -> torch.Tensor:
    """(E,) Σ_t ĉ_t per episode from the flat (M,) contributions and each one's episode index."""
    return torch.zeros(episodes, dtype=contributions.dtype, device=contributions.device).index_add(
        0, owner, contributions
    )


def attribution_loss(contributions: torch.Tensor, owner: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """SPA's estimator loss: mean over episodes of (Σ_t ĉ_t − R)²."""
    return ((episode_sums(contributions, owner, len(targets)) - targets) ** 2).mean()


@torch.no_grad()
def turn_end_states(
    model, batch: RolloutBatch, ends: list[list[int]], batch_size: int = 16, autocast_dtype=None
) -> list[torch.Tensor]:
    """Per row, the (T_i, d) final hidden states of ``model`` (its trunk, ``base_model``) at the last token of each
    turn, float32, no gradient; forwards of ``batch_size`` rows."""
    trunk = getattr(model, "base_model", model)
    out: list[torch.Tensor] = [torch.zeros(0)] * len(batch)
    rows = [i for i in range(len(batch)) if ends[i]]
    rows.sort(key=lambda i: ends[i][-1])
    for k in range(0, len(rows), batch_size):
        chunk = rows[k : k + batch_size]
        width = max(ends[i][-1] for i in chunk) + 1
        sel = torch.tensor(chunk, device=batch.completion_ids.device)
        ids, attention, positions = sequence_inputs(
            batch.prompt_ids[sel],
            batch.prompt_mask[sel],
            batch.completion_ids[sel, :width],
            batch.completion_mask[sel, :width],
        )
        with torch.autocast(
            ids.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
        ):
            hidden = trunk(
                input_ids=ids, attention_mask=padded_causal_mask(attention), position_ids=positions, use_cache=False
            ).last_hidden_state[:, -width:]
        for j, i in enumerate(chunk):
            out[i] = hidden[j, torch.tensor(ends[i], device=hidden.device)].float()
    return out


@GROUP_STAGES.register
class ProgressAttribution:
    """Group stage: SPA-RL's turn rewards — a learned progress estimator's per-turn contributions (fitted online so
    that they add up to each episode's outcome) plus a grounding bonus for executable actions — into
    ``batch.extras["turn_rewards"]`` (see module doc). Needs ``rollout=multi_turn``. Settings:
    ``contribution_weight`` α, ``grounding_weight`` β, ``outcome_term`` (null: the run's reward), ``outcome_weight``,
    the head's ``lr`` / ``weight_decay``, ``updates`` per step, ``buffer_steps``, ``batch_size`` (rows per forward)."""

    def __init__(
        self,
        contribution_weight: float = 1.0,
        grounding_weight: float = 0.5,
        outcome_term: str | None = None,
        outcome_weight: float = 0.0,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        updates: int = 8,
        buffer_steps: int = 4,
        batch_size: int = 16,
    ):
        where = "algorithm.group_stages: ProgressAttribution"
        for key, v in (("contribution_weight", contribution_weight), ("grounding_weight", grounding_weight)):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{where}.{key}={v} must be a finite number >= 0")
        if not math.isfinite(outcome_weight) or outcome_weight < 0:
            raise ValueError(f"{where}.outcome_weight={outcome_weight} must be a finite number >= 0")
        if lr <= 0 or weight_decay < 0:
            raise ValueError(f"{where}: lr={lr} must be > 0 and weight_decay={weight_decay} >= 0")
        for key, v in (("updates", updates), ("buffer_steps", buffer_steps), ("batch_size", batch_size)):
            if v < 1:
                raise ValueError(f"{where}.{key}={v} must be >= 1")
        self.alpha, self.beta = float(contribution_weight), float(grounding_weight)
        self.outcome_term, self.outcome_weight = outcome_term, float(outcome_weight)
        self.lr, self.weight_decay, self.updates = float(lr), float(weight_decay), int(updates)
        self.batch_size = int(batch_size)
        self.buffer: deque = deque(maxlen=int(buffer_steps))  # per step: (features (M, d), owner (M,), targets (E,))
        self.head: nn.Linear | None = None
        self.optimizer = None
        self._saved = None  # a checkpoint's head, loaded once its width is known

    def build(self, width: int, device) -> None:
        self.head = nn.Linear(width, 1, device=device)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.optimizer = torch.optim.Adam(self.head.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self._saved is not None:
            self.head.load_state_dict(self._saved["head"])
            self.optimizer.load_state_dict(self._saved["optimizer"])
            self._saved = None

    def contributions(self, features: torch.Tensor) -> torch.Tensor:
        """(M,) ĉ of (M, d) turn-end states (scaled by 1/√d)."""
        return self.head(features / math.sqrt(features.shape[-1])).squeeze(-1)

    def fit(self) -> None:
        """``updates`` Adam steps on the MSE over the buffered episodes."""
        feats = torch.cat([f for f, _, _ in self.buffer])
        owners, targets, base = [], [], 0
        for _, owner, target in self.buffer:
            owners.append(owner + base)
            targets.append(target)
            base += len(target)
        owner, target = torch.cat(owners), torch.cat(targets)
        for _ in range(self.updates):
            self.optimizer.zero_grad(set_to_none=True)
            attribution_loss(self.contributions(feats), owner, target).backward()
            self.optimizer.step()

    def outcome(self, batch: RolloutBatch) -> torch.Tensor:
        if self.outcome_term is None:
            return batch.reward
        if self.outcome_term not in batch.reward_names:
            raise KeyError(
                f"algorithm.group_stages: ProgressAttribution.outcome_term={self.outcome_term!r} is not a reward term "
                f"(terms: {batch.reward_names})"
            )
        return batch.term(self.outcome_term)

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        policy = batch.extras.get(POLICY_TOKENS)
        episodes = [r.get("episode") for r in batch.records]
        if policy is None or any(e is None for e in episodes):
            raise ValueError(
                "algorithm.group_stages: ProgressAttribution (SPA-RL) needs multi-turn episodes, and this batch has "
                "none (batch.extras['policy_tokens'], record['episode']): set rollout=multi_turn with an environment, "
                "e.g. environment=textworld dataset=textworld reward=text_game prompt=text_game"
            )
        outcome = self.outcome(batch).float()
        n = len(batch)
        ends = turn_ends(policy.to(batch.completion_mask.device), batch.completion_mask)
        states = turn_end_states(ctx.policy, batch, ends, self.batch_size, getattr(ctx, "autocast_dtype", None))
        rows = [i for i in range(n) if ends[i]]
        width = max([1] + [len(e) for e in ends])
        rewards = torch.full((n, width), float("nan"))
        s = batch.stats
        if not rows:  # no turns at all: nothing to attribute
            batch.extras[TURN_REWARDS] = rewards.to(batch.completion_mask.device)
            return batch
        feats = torch.cat([states[i] for i in rows])
        owner = torch.cat([torch.full((len(ends[i]),), j, dtype=torch.long) for j, i in enumerate(rows)])
        owner = owner.to(feats.device)
        target = outcome[torch.tensor(rows, device=outcome.device)].to(feats.device)
        if self.head is None:
            self.build(feats.shape[-1], feats.device)
        with torch.no_grad():
            s["spa/estimator_loss_before"] = float(attribution_loss(self.contributions(feats), owner, target))
        self.buffer.append((feats, owner, target))
        self.fit()
        with torch.no_grad():
            c = self.contributions(feats)
            s["spa/estimator_loss"] = float(attribution_loss(c, owner, target))
            sums = episode_sums(c, owner, len(rows))
        c = c.float().cpu()
        grounded, turn_r, at = [], [], 0
        for j, i in enumerate(rows):
            T = len(ends[i])
            g = grounding(episodes[i], T)
            r = [self.alpha * float(c[at + t]) + self.beta * g[t] for t in range(T)]
            r[-1] += self.outcome_weight * float(outcome[i])
            rewards[i, :T] = torch.tensor(r)
            grounded += g
            turn_r += r
            at += T
        batch.extras[TURN_REWARDS] = rewards.to(batch.completion_mask.device)
        s["spa/contribution_mean"] = float(c.mean())
        s["spa/contribution_std"] = float(c.std(unbiased=False))
        s["spa/contribution_sum_mean"] = float(sums.mean())
        s["spa/grounding_mean"] = sum(grounded) / len(grounded)
        s["spa/turn_reward_mean"] = sum(turn_r) / len(turn_r)
        s["spa/buffer_episodes"] = float(sum(len(t) for _, _, t in self.buffer))
        return batch

    def state_dict(self) -> dict | None:
        if self.head is None:
            return self._saved
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        if not state:
            return
        if self.head is None:  # built at the first step, when the states' width is known
            self._saved = state
        else:
            self.head.load_state_dict(state["head"])
            self.optimizer.load_state_dict(state["optimizer"])
