"""Advantages of branched rollouts: ARPO's advantage attribution ("Agentic Reinforced Policy Optimization", Dong et
al., 2025, arXiv 2507.19849, §3.2; released code dongguanting/ARPO: GRPO's ``compute_grpo_outcome_advantage``).

The rows of a group are whole episodes of ARPO's branching rollout (``rlexp.rollout.branching``): some start from
the prompt, others are branches that copy a parent's first tokens and continue on their own
(``record["episode"]["branch"]`` = {index, parent, shared}). Every row gets GRPO's group-normalised outcome advantage
Â_i = (r_i − mean_g) / (std_g + ε). Then:

* ``soft`` (the paper's default, and all the released code does): nothing more — each row trains its copy of a
  shared prefix with its own Â_i, and since the copies are the same tokens in the same context their ratios are
  equal, so the prefix's update is driven by the sharing rows' advantages together (the paper's App. D.1);
* ``hard``: a token at completion position j of row i gets the mean of Â_q over the rows q of its group that share
  positions 0..j with row i (i itself included): tokens a row shares with others take the mean advantage of the
  branches that share them, the tokens after the last branch point its own.

Two rows share the first L tokens, L the shortest of the branch lengths (``shared``) on the tree path between them
(a row with its ancestor: the shares on the way up; rows of different global episodes: 0).

Metrics: ``arpo/branched_rows_frac`` (rows with a parent), ``arpo/shared_adv_shift`` (hard: mean |A − Â_i| over the
valid tokens shared with another row)."""

from __future__ import annotations

import torch

from rlexp.algorithms.advantages.group import normalize_rewards
from rlexp.core.batch import RolloutBatch
from rlexp.core.registry import ADVANTAGES

ATTRIBUTIONS = ("soft", "hard")


def shared_lengths(parents: list[int | None], shares: list[int], lengths: list[int]) -> list[list[int]]:
    """L[r][q]: how many first completion tokens rows r and q of one group share, from each row's ``parents`` entry
    (the row it branched from, None: a root), ``shares`` (tokens copied from it) and ``lengths`` (its own length)."""
    n = len(parents)
    chains = []  # each row's ancestors, nearest first, with the tokens it shares with each
    for r in range(n):
        chain, cur, run = {r: lengths[r]}, r, lengths[r]
        while parents[cur] is not None and parents[cur] not in chain:
            run = min(run, shares[cur])
            cur = parents[cur]
            chain[cur] = run
        chains.append(chain)
    out = [[0] * n for _ in range(n)]
    for r in range(n):
        for q in range(n):
            for a, run in chains[r].items():  # the nearest common ancestor
                if a in chains[q]:
                    out[r][q] = min(run, chains[q][a])
                    break
    return out


def hard_attribution(advantages: torch.Tensor, shared: list[list[int]], width: int) -> torch.Tensor:
    """(n, width) per-token advantages of one group: position j of row r gets the mean of ``advantages`` (n,) over
    the rows q with ``shared[r][q]`` > j (row r itself while j < its length); past its length, its own."""
    adv = advantages.float()
    L = torch.tensor(shared, dtype=torch.long, device=adv.device)  # (n, n)
    pos = torch.arange(width, device=adv.device)
    sharing = pos[None, None, :] < L[:, :, None]  # (r, q, j)
    count = sharing.sum(1)
    total = (sharing.float() * adv[None, :, None]).sum(1)
    return torch.where(count > 0, total / count.clamp(min=1), adv[:, None].expand(-1, width))


@ADVANTAGES.register
def arpo(
    batch: RolloutBatch, attribution: str = "soft", scale: str = "group", eps: float = 1e-6, singleton: str = "zero"
) -> torch.Tensor:
    """ARPO's advantage (module doc): GRPO's (``scale``, ``eps``, ``singleton`` as ``normalize_rewards``), (N,) under
    ``attribution=soft``, (N, T) with the shared prefixes' mean advantages under ``hard``. Needs the branching
    rollout's episodes (``rollout=arpo``)."""
    if attribution not in ATTRIBUTIONS:
        raise ValueError(f"algorithm.advantage.attribution={attribution!r} is not one of {list(ATTRIBUTIONS)}")
    episodes = [r.get("episode") for r in batch.records]
    if any(e is None or "branch" not in e for e in episodes):
        raise ValueError(
            "algorithm.advantage (arpo) needs ARPO's branched episodes (record['episode']['branch']): use rollout=arpo "
            "with an environment, e.g. rollout=arpo environment=tool_use tools=[python] prompt=python_tool"
        )
    device = batch.completion_mask.device
    adv = normalize_rewards(batch.reward.to(device), batch.group_ids.to(device), scale, eps, singleton)
    branched = [e["branch"]["parent"] is not None for e in episodes]
    batch.stats["arpo/branched_rows_frac"] = sum(branched) / max(1, len(episodes))
    if attribution == "soft":
        return adv
    width = batch.completion_mask.shape[1]
    lengths = batch.completion_mask.sum(-1).tolist()
    out = adv[:, None].float().expand(-1, width).clone()
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    shift, counted = 0.0, 0
    for rows in groups.values():
        where = {episodes[i]["branch"]["index"]: k for k, i in enumerate(rows)}  # a row's place in the group -> k
        parents = [where.get(episodes[i]["branch"]["parent"]) for i in rows]  # a parent left out: a root here
        shares = [int(episodes[i]["branch"]["shared"]) for i in rows]
        shared = shared_lengths(parents, shares, [int(lengths[i]) for i in rows])
        idx = torch.tensor(rows, device=device)
        per_token = hard_attribution(adv[idx], shared, width)
        out[idx] = per_token
        # the tokens each row shares with another row of its group (valid ones): how far the attribution moved them
        others = torch.tensor([max([s for q, s in enumerate(row) if q != r] or [0]) for r, row in enumerate(shared)])
        mask = (torch.arange(width)[None, :] < others[:, None]).to(device) & batch.completion_mask[idx].bool()
        shift += float(((per_token - adv[idx][:, None]).abs() * mask).sum())
        counted += int(mask.sum())
    batch.stats["arpo/shared_adv_shift"] = shift / counted if counted else 0.0
    return out
