"""AT-GRPO's agent- and turn-wise grouped advantage ("Stronger Together: On-Policy Reinforcement Learning for
Collaborative LLMs", Zhao et al., 2025, arXiv 2510.11062; released code pettingllms-ai/PettingLLMs,
``pettingllms/trainer/multi_agents_ppo_trainer.py``: ``_assign_consistent_uids`` keys each row by (environment,
turn, agent), then verl's GRPO advantage within each key).

Under a multi-agent, multi-turn workflow the prompts differ by agent and by turn, so GRPO's group — the rollouts of
one prompt — is re-drawn: the rows of one task that share a turn index and an agent form a group, and each row's
advantage is its reward relative to that group, A = (r − mean_g) / (std_g + ε). With AT-GRPO's tree rollout
(``rlexp.rollout.turn_groups``: at each turn K candidate actions from the same state, the best continues) such a
group is exactly the K candidates of one turn, which share their context; each row is one candidate's turn
(the path before it is context, out of the loss through ``batch.extras["policy_tokens"]``), so the row's advantage
applies to that turn's tokens.

Keys: (the row's group — its prompt —, ``record["episode"]["slot"]["turn"]``, ``slot["agent"]``). Rows of turns the
episode never reached (turn −1: empty rows) get 0. Statistics as ``advantages.group.grpo`` (Bessel std, ε added to
the std, a group of one gets 0; ``scale=none`` only centres — the release's ``norm_adv_by_std_in_grpo=false``).

Metrics: ``at_grpo/turn_groups`` ((turn, agent) groups of two or more rows in the batch), ``at_grpo/group_size_mean``,
``at_grpo/varied_frac`` (share of those groups whose rewards differ: the ones that carry a signal),
``at_grpo/adv_abs_mean`` (mean |A| over the rows of those groups)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES


def turn_group_keys(batch: RolloutBatch) -> list[tuple[int, int, int]]:
    """Each row's (group, turn, agent) from its episode's ``slot`` (turn −1: a turn never reached)."""
    keys = []
    for i, record in enumerate(batch.records):
        slot = (record.get("episode") or {}).get("slot")
        if slot is None:
            raise ValueError(
                "algorithm.advantage (agent_turn_groups) reads the turn-wise candidate groups of AT-GRPO's tree "
                f"rollout, and row {i} has none (record['episode']['slot']): use rollout=turn_groups with an "
                "environment, e.g. environment=textworld dataset=textworld reward=text_game prompt=text_game"
            )
        keys.append((int(batch.group_ids[i]), int(slot["turn"]), int(slot.get("agent", 0))))
    return keys


@ADVANTAGES.register
def agent_turn_groups(
    batch: RolloutBatch, scale: str = "group", eps: float = 1e-6, singleton: str = "zero"
) -> torch.Tensor:
    """AT-GRPO's advantage, (N,): the reward normalised within each (prompt, turn, agent) group (see module doc);
    ``scale``, ``eps`` and ``singleton`` as in ``advantages.group.normalize_rewards``."""
    keys = turn_group_keys(batch)
    device = batch.reward.device
    index: dict[tuple, int] = {}
    ids = torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long, device=device)
    adv = normalize_rewards(batch.reward, ids, scale=scale, eps=eps, singleton=singleton)
    reached = torch.tensor([k[1] >= 0 for k in keys], dtype=torch.bool, device=device)
    adv = torch.where(reached, adv, torch.zeros_like(adv))
    sizes: dict[tuple, list[float]] = {}
    for k, r in zip(keys, batch.reward.float().tolist()):
        if k[1] >= 0:
            sizes.setdefault(k, []).append(r)
    groups = [v for v in sizes.values() if len(v) > 1]
    in_groups = torch.tensor([k[1] >= 0 and len(sizes[k]) > 1 for k in keys], dtype=torch.bool, device=device)
    s = batch.stats
    s["at_grpo/turn_groups"] = float(len(groups))
    s["at_grpo/group_size_mean"] = sum(len(v) for v in groups) / len(groups) if groups else 0.0
    s["at_grpo/varied_frac"] = sum(max(v) > min(v) for v in groups) / len(groups) if groups else 0.0
    s["at_grpo/adv_abs_mean"] = float(adv[in_groups].abs().mean()) if bool(in_groups.any()) else 0.0
    return adv
