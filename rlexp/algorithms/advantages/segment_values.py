"""Per-token advantages from Monte-Carlo state values at boundaries of a completion: VinePPO's step advantages
("VinePPO: Refining Credit Assignment in RL Training of LLMs", Kazemnejad et al., 2024, arXiv 2410.01679; released
code McGill-NLP/VinePPO: ``_compute_step_advantages`` and ``_compute_token_advantages``) and SPO-chain's segment
advantages ("Segment Policy Optimization", Guo et al., 2025, arXiv 2505.23564; released code AIFrameResearch/SPO: its
``_compute_token_advantages``).

The group stage ``rlexp.algorithms.group_stages.monte_carlo.MonteCarloValues`` gives each row boundaries
b_0 < b_1 < … < b_m (token indices: state s_{b_j} = the prompt + the completion's first b_j tokens) with values
V̂_0 … V̂_m, and the row's outcome r. Segment j holds tokens [b_j, b_{j+1}) (the last one [b_m, L)); with γ = λ = 1
and the reward paid at the end only (step rewards 0, the outcome on the last step, V̂ = 0 after the last token):

    A_j = V̂_{j+1} − V̂_j   (j < m)          A_m = r − V̂_m

on every token of segment j (VinePPO's r_k + V̂(s_{k+1}) − V̂(s_k); SPO-chain's V(end) − V(start)). Tokens before
b_0 (SPO-chain, when its first cutpoint is not the first token) get 0, as in the release (no value before them;
they are all sampled with p ≥ the threshold, so its probability mask keeps them out of the loss anyway).

``whiten`` (both releases' PPO trainer, ``whiten_advantages``): (A − mean) · rsqrt(var + ``eps``) over the tokens
that enter the loss (``rlexp.core.masks.loss_mask``: under SPO-chain's probability mask, the low-probability tokens,
as its trainer whitens); the releases whiten each training batch, we whiten the rollout batch once (as ``gae``).
Advantages are 0 outside the loss mask. Stats: ``advantage/segment_abs_mean`` (mean |A_j| over the segments, before
whitening)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlexp.algorithms.group_stages.monte_carlo import MC_BOUNDARIES, MC_OUTCOME, MC_VALUES
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import KL_PENALTY, loss_mask
from rlexp.core.registry import ADVANTAGES
from rlexp.core.stats import masked_whiten


def segment_advantages(
    boundaries: Sequence[int], values: Sequence[float], outcome: float, length: int
) -> tuple[list[float], list[float]]:
    """(per-token advantages of one completion of ``length`` tokens, the advantage of each segment): segment j runs
    from ``boundaries[j]`` to the next boundary (the last to the end) with V̂_{j+1} − V̂_j (the last: ``outcome`` −
    V̂_m); tokens before the first boundary get 0."""
    adv = [0.0] * length
    per_segment = []
    for j, b in enumerate(boundaries):
        last = j + 1 == len(boundaries)
        end = length if last else boundaries[j + 1]
        a = float((outcome if last else values[j + 1]) - values[j])
        per_segment.append(a)
        for t in range(b, min(end, length)):
            adv[t] = a
    return adv, per_segment


@ADVANTAGES.register
def segment_values(batch: RolloutBatch, whiten: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """VinePPO's / SPO-chain's per-token advantages (module doc) from the Monte-Carlo values
    ``MonteCarloValues`` stores in ``batch.extras``. Returns (N, T)."""
    missing = [k for k in (MC_BOUNDARIES, MC_VALUES, MC_OUTCOME) if k not in batch.extras]
    if missing:
        raise ValueError(
            f"algorithm.advantage (segment_values) reads batch.extras {missing}, which no stage in "
            "algorithm.group_stages set (rlexp.algorithms.group_stages.monte_carlo.MonteCarloValues does; put it last)"
        )
    if KL_PENALTY in batch.extras:
        raise ValueError(
            "algorithm.advantage (segment_values) pays the outcome the Monte-Carlo values were estimated with; "
            "algorithm.kl.mode=reward would charge a KL the continuations never paid: use algorithm.kl.mode=loss"
        )
    N, T = batch.completion_mask.shape
    bounds = batch.extras[MC_BOUNDARIES].long().cpu()
    values = batch.extras[MC_VALUES].float().cpu()
    outcome = batch.extras[MC_OUTCOME].float().cpu()
    lengths = batch.completion_mask.sum(-1).tolist()
    adv = torch.zeros(N, T)
    segments = []
    for i in range(N):
        keep = bounds[i] >= 0
        row, seg = segment_advantages(
            bounds[i][keep].tolist(), values[i][keep].tolist(), float(outcome[i]), int(lengths[i])
        )
        adv[i, : len(row)] = torch.tensor(row)
        segments.extend(seg)
    device = batch.completion_mask.device
    adv = adv.to(device)
    mask = loss_mask(batch).float()
    if whiten:
        stats_mask = mask if float(mask.sum()) > 0 else batch.completion_mask.float()
        adv = masked_whiten(adv, stats_mask, eps)
    batch.stats["advantage/segment_abs_mean"] = sum(abs(a) for a in segments) / len(segments) if segments else 0.0
    return adv * mask
