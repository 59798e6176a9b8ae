"""Replay of earlier completions into the step's batch: RePO's per-prompt replay (``Replay``) and ReMix's mix-policy
groups (``MixPolicyReplay``, see its docstring).

RePO ("RePO: Replay-Enhanced Policy Optimization", Li,
Zhou, Lam, Yang and Lu, 2025; arXiv 2506.09340).

A per-prompt FIFO buffer keeps the completions the policy wrote for a prompt on earlier steps, each with the
log-probs of the policy that sampled it (the behaviour policy), its reward terms and its length flag. When a prompt
comes back, ``num_replays`` of its stored completions are chosen by a replay strategy and added to the step's
batch beside the fresh group; the fresh completions are pushed into the buffer afterwards, so a step never
replays its own rollouts. Replayed rows are marked ``batch.extras["replayed"]``: the trainer keeps their
behaviour log-probs as the ratio's denominator (π_θ / π_behaviour, clipped like any other row), leaves them out
of the reward metrics and of the train-inference mismatch.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import LOSS_MASK, REPLAYED
from rlexp.core.registry import GROUP_STAGES

STRATEGIES = ("all", "random_k", "highest_k", "recent_k", "max_variance_k")
WIDEN = ("split", "mixed")


def max_variance_subset(scores: list[float], k: int) -> list[int]:
    """Indices of the k scores with the largest (population) variance, ties to the larger sum, then to the
    earliest subset in lexicographic order (RePO's ``max_variance_k``: an exhaustive search over subsets)."""
    best, best_key = None, None
    for subset in itertools.combinations(range(len(scores)), k):
        vals = torch.tensor([scores[j] for j in subset], dtype=torch.float64)
        key = (float(vals.var(unbiased=False)), float(vals.sum()))
        if best_key is None or key > best_key:
            best, best_key = list(subset), key
    return best or []


@GROUP_STAGES.register
class Replay:
    """RePO's replay: add ``num_replays`` stored completions of each prompt to its group once the prompt's buffer
    holds ``min_size`` (FIFO of ``capacity`` per prompt; the released code's ``min_cache_to_replay`` and
    ``max_cache_size``). Strategies (``strategy``; the released code's names): ``all``, ``random_k`` (seeded),
    ``highest_k`` (largest total reward), ``recent_k`` (newest), ``max_variance_k`` (the k-subset whose rewards vary
    most). ``widen``: ``split`` gives the replayed rows a group of their own, so the fresh and the replayed
    completions are normalised apart (the released script's ``adv_norm_mode=split``); ``mixed`` puts them in the
    fresh group, which they widen (one normalisation over G + k). ``loss_coef``: the replayed rows' loss weight
    (the released code's ``off_policy_loss_coef``; 1 with seq-mean-token-mean aggregation is one loss over all
    rows, as its ``loss_type=grpo``). Place it first among the group stages: it stores the reward as scored.

    Stats: ``replay/rows`` (replayed completions this step), ``replay/prompts`` (prompts that replayed),
    ``replay/buffer_prompts`` and ``replay/buffer_rows`` (after the push), ``replay/age_mean`` (steps since the
    replayed completions were sampled), ``replay/reward_mean`` (their mean reward). ``off_policy``: skipped after a
    policy reincarnation (``algorithm.reincarnate_at``)."""

    off_policy = True

    def __init__(
        self,
        strategy: str = "highest_k",
        num_replays: int = 8,
        min_size: int = 16,
        capacity: int = 16,
        widen: str = "split",
        loss_coef: float = 1.0,
        seed: int = 0,
    ):
        if strategy not in STRATEGIES:
            raise ValueError(f"group stage Replay.strategy={strategy!r} is not one of {list(STRATEGIES)}")
        if widen not in WIDEN:
            raise ValueError(f"group stage Replay.widen={widen!r} is not one of {list(WIDEN)}")
        if num_replays < 1 or capacity < 1 or min_size < 1:
            raise ValueError(
                f"group stage Replay: num_replays={num_replays}, min_size={min_size} and capacity={capacity} "
                "must be >= 1"
            )
        if min_size > capacity:
            raise ValueError(
                f"group stage Replay.min_size={min_size} > capacity={capacity}: no prompt would ever be replayed"
            )
        if loss_coef < 0:
            raise ValueError(f"group stage Replay.loss_coef={loss_coef} must be >= 0")
        self.strategy, self.num_replays, self.min_size, self.capacity = strategy, num_replays, min_size, capacity
        self.widen, self.loss_coef, self.seed = widen, float(loss_coef), seed
        self.buffer: dict[str, deque] = {}

    # ---- the buffer ------------------------------------------------------------------------------
    def choose(self, entries: list[dict], step: int, prompt: str) -> list[dict]:
        """The entries a prompt replays under the strategy (at most ``num_replays``; all of them for ``all``)."""
        if len(entries) < self.min_size:
            return []
        k = len(entries) if self.strategy == "all" else min(len(entries), self.num_replays)
        if self.strategy == "all":
            return list(entries)
        if self.strategy == "random_k":  # seeded by run seed, step and prompt: a resumed run draws the same rows
            rng = random.Random(f"{self.seed}:{step}:{prompt}")
            return [entries[i] for i in sorted(rng.sample(range(len(entries)), k))]
        if self.strategy == "highest_k":  # stable: equal rewards keep buffer order (oldest first)
            order = sorted(range(len(entries)), key=lambda i: -entries[i]["reward"])
            return [entries[i] for i in order[:k]]
        if self.strategy == "recent_k":
            return list(entries)[-k:]
        return [entries[i] for i in max_variance_subset([e["reward"] for e in entries], k)]

    def push(self, batch: RolloutBatch, step: int) -> None:
        for prompt, entry in zip(batch.prompts, row_entries(batch, step)):
            self.buffer.setdefault(prompt, deque(maxlen=self.capacity)).append(entry)

    # ---- the stage -------------------------------------------------------------------------------
    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if batch.rewards is None or batch.reward is None:
            raise RuntimeError("group stage Replay runs after the reward stage (it stores and replays rewards)")
        step = int(getattr(ctx, "step", 0) or 0)
        fresh_n = len(batch)
        device = batch.completion_ids.device
        batch.extras[REPLAYED] = torch.zeros(fresh_n, dtype=torch.bool, device=device)
        firsts: dict[int, int] = {}
        for i, g in enumerate(batch.group_ids.tolist()):
            firsts.setdefault(g, i)
        parts, ages, rewards, prompts_replayed = [], [], [], 0
        next_id = int(batch.group_ids.max()) + 1 if fresh_n else 0
        for g, first in firsts.items():
            rows = (batch.group_ids == g).nonzero().squeeze(-1)
            parts.append(batch.select(rows))
            chosen = self.choose(list(self.buffer.get(batch.prompts[first], ())), step, batch.prompts[first])
            if not chosen:
                continue
            prompts_replayed += 1
            gid = g if self.widen == "mixed" else next_id
            next_id += self.widen == "split"
            parts.append(stored_rows(batch, first, chosen, gid))
            ages += [step - e["step"] for e in chosen]
            rewards += [e["reward"] for e in chosen]
        self.push(batch, step)
        if not ages:  # nothing replayed: no mark, so the update takes its plain path
            batch.extras.pop(REPLAYED)
        out = RolloutBatch.concat(parts) if ages else batch
        out.stats = dict(batch.stats)
        if ages and self.loss_coef != 1.0:
            weight = torch.where(out.extras[REPLAYED], self.loss_coef, 1.0).float()
            prev = out.extras.get(LOSS_MASK)
            out.extras[LOSS_MASK] = weight if prev is None else prev.float() * weight
        out.stats.update(
            {
                "replay/rows": float(len(ages)),
                "replay/prompts": float(prompts_replayed),
                "replay/buffer_prompts": float(len(self.buffer)),
                "replay/buffer_rows": float(sum(len(d) for d in self.buffer.values())),
            }
        )
        if ages:
            out.stats["replay/age_mean"] = sum(ages) / len(ages)
            out.stats["replay/reward_mean"] = sum(rewards) / len(rewards)
        return out

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"buffer": {p: list(d) for p, d in self.buffer.items()}}

    def load_state_dict(self, state: dict | None) -> None:
        saved = (state or {}).get("buffer", {})
        self.buffer = {p: deque(entries, maxlen=self.capacity) for p, entries in saved.items()}


@GROUP_STAGES.register
class MixPolicyReplay:
    """ReMix's mix-policy data ("Squeeze the Soaked Sponge: Efficient Off-policy Reinforcement Finetuning for Large
    Language Model", Liang et al., 2025; arXiv 2507.06892): the step trains on its own groups plus whole groups
    generated by the ``history`` policies before it (the rollouts of the previous ``history`` steps, whatever their
    prompts), ⌈``replay_frac`` × fresh groups⌉ of them drawn uniformly without replacement (seeded by run seed and
    step). A replayed group keeps its rewards and its group, so its advantages are those it had when sampled; its
    rows keep the log-probs of the policy that sampled them as the ratio's denominator (``extras["replayed"]``).
    ``off_policy``: skipped after the policy reincarnation (``algorithm.reincarnate_at``).

    Stats: ``replay/rows``, ``replay/groups``, ``replay/age_mean`` (steps since sampled), ``replay/reward_mean``,
    ``replay/buffer_groups``."""

    off_policy = True

    def __init__(self, history: int = 1, replay_frac: float = 1.0, seed: int = 0):
        if history < 1:
            raise ValueError(f"group stage MixPolicyReplay.history={history} must be >= 1")
        if replay_frac <= 0:
            raise ValueError(f"group stage MixPolicyReplay.replay_frac={replay_frac} must be > 0")
        self.history, self.replay_frac, self.seed = history, float(replay_frac), seed
        self.steps: deque = deque(maxlen=history)  # per earlier step: (step, [group entries])

    def __call__(self, batch: RolloutBatch, ctx) -> RolloutBatch:
        if batch.rewards is None or batch.reward is None:
            raise RuntimeError("group stage MixPolicyReplay runs after the reward stage (it stores rewards)")
        step = int(getattr(ctx, "step", 0) or 0)
        device = batch.completion_ids.device
        batch.extras[REPLAYED] = torch.zeros(len(batch), dtype=torch.bool, device=device)
        stored = [(s, g) for s, groups in self.steps for g in groups]
        want = min(len(stored), math.ceil(self.replay_frac * batch.num_groups))
        rng = random.Random(f"{self.seed}:{step}")
        chosen = [stored[i] for i in sorted(rng.sample(range(len(stored)), want))] if want else []
        groups = []  # this step's groups: a one-row template (prompt, record, reward names) and the stored rows
        for g in dict.fromkeys(batch.group_ids.tolist()):
            sub = batch.select((batch.group_ids == g).nonzero().squeeze(-1))
            groups.append((sub, row_entries(sub, step)))
        parts = [batch]
        next_id = int(batch.group_ids.max()) + 1 if len(batch) else 0
        for _, (template, entries) in chosen:
            parts.append(stored_rows(template, 0, entries, next_id))
            next_id += 1
        self.steps.append((step, [(sub.select([0]), entries) for sub, entries in groups]))
        if not chosen:  # nothing replayed: no mark, so the update takes its plain path
            batch.extras.pop(REPLAYED)
        out = RolloutBatch.concat(parts) if chosen else batch
        out.stats = dict(batch.stats)
        ages = [step - s for s, (_, entries) in chosen for _ in entries]
        rewards = [e["reward"] for _, (_, entries) in chosen for e in entries]
        out.stats.update(
            {
                "replay/rows": float(len(ages)),
                "replay/groups": float(len(chosen)),
                "replay/buffer_groups": float(sum(len(groups) for _, groups in self.steps)),
            }
        )
        if ages:
            out.stats["replay/age_mean"] = sum(ages) / len(ages)
            out.stats["replay/reward_mean"] = sum(rewards) / len(rewards)
        return out

    def state_dict(self) -> dict:
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: dict | None) -> None:
        self.steps = deque((state or {}).get("steps", []), maxlen=self.history)


def row_entries(batch: RolloutBatch, step: int) -> list[dict]:
    """What a replay buffer keeps of each row of ``batch`` (on the CPU, trimmed to the completion): tokens, the
    sampling policy's log-probs, reward terms and total, the length flag, per-row extras, the step."""
    per_row = _per_row_extras(batch)
    out = []
    for i in range(len(batch)):
        n = int(batch.completion_mask[i].sum())
        out.append(
            {
                "ids": batch.completion_ids[i, :n].detach().cpu().clone(),
                "logprobs": batch.sampling_logprobs[i, :n].detach().float().cpu().clone(),
                "mask": batch.completion_mask[i, :n].detach().cpu().clone(),
                "text": batch.completions[i],
                "truncated": bool(batch.truncated[i]),
                "rewards": batch.rewards[i].detach().cpu().clone(),
                "failures": batch.reward_failures[i].detach().cpu().clone(),
                "reward": float(batch.reward[i]),
                "extras": {k: v[i].detach().cpu().clone() for k, v in per_row.items()},
                "step": int(step),
            }
        )
    return out


def stored_rows(batch: RolloutBatch, first: int, entries: list[dict], group_id: int) -> RolloutBatch:
    """Rows of ``entries`` for the prompt of ``batch`` row ``first``, padded to the widest stored completion."""
    device = batch.completion_ids.device
    k, width = len(entries), max(len(e["ids"]) for e in entries)
    ids = torch.zeros(k, width, dtype=batch.completion_ids.dtype, device=device)
    mask = torch.zeros(k, width, dtype=batch.completion_mask.dtype, device=device)
    logp = torch.zeros(k, width, dtype=batch.sampling_logprobs.dtype, device=device)
    for j, e in enumerate(entries):
        n = len(e["ids"])
        ids[j, :n], mask[j, :n] = e["ids"].to(device), e["mask"].to(device)
        logp[j, :n] = e["logprobs"].to(device=device, dtype=logp.dtype)
    extras = {}
    for key, v in _per_row_extras(batch).items():
        rows = [e["extras"].get(key) for e in entries]
        fill = torch.zeros_like(v[first])
        extras[key] = torch.stack([(r if r is not None else fill.cpu()).to(v.device, v.dtype) for r in rows])
    extras[REPLAYED] = torch.ones(k, dtype=torch.bool, device=device)
    if LOSS_MASK in batch.extras:  # a stage before this one weighted rows; the replayed ones enter whole
        extras[LOSS_MASK] = torch.ones(k, dtype=batch.extras[LOSS_MASK].dtype, device=device)
    return RolloutBatch(
        prompt_ids=batch.prompt_ids[first : first + 1].expand(k, -1).clone(),
        prompt_mask=batch.prompt_mask[first : first + 1].expand(k, -1).clone(),
        completion_ids=ids,
        completion_mask=mask,
        sampling_logprobs=logp,
        truncated=torch.tensor([e["truncated"] for e in entries], dtype=batch.truncated.dtype, device=device),
        group_ids=torch.full((k,), group_id, dtype=batch.group_ids.dtype, device=batch.group_ids.device),
        prompts=[batch.prompts[first]] * k,
        completions=[e["text"] for e in entries],
        records=[batch.records[first]] * k,
        rewards=torch.stack([e["rewards"] for e in entries]).to(batch.rewards.device, batch.rewards.dtype),
        reward_names=batch.reward_names,
        reward_weights=batch.reward_weights,
        reward=torch.tensor([e["reward"] for e in entries], dtype=batch.reward.dtype, device=batch.reward.device),
        reward_failures=torch.stack([e["failures"] for e in entries]).to(batch.reward_failures.device),
        extras=extras,
    )


def _per_row_extras(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """The batch's per-row tensor extras (one entry per row), which a replayed row carries along; the replay mark
    and the loss weights are the stage's own."""
    n = len(batch)
    return {
        k: v
        for k, v in batch.extras.items()
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n and k not in (REPLAYED, LOSS_MASK)
    }
