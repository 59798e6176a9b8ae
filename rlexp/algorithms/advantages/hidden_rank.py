"""VERL (Velocity-Exploiting Rank-Learning) — "Beyond the Exploration-Exploitation Trade-off: A Hidden State
Approach for LLM Reasoning in RLVR" (Huang, Huang, Fan et al., 2025; arXiv 2509.23808).

Hidden-state statistics of each completion (``rank_statistics``, computed by the trainer in the old policy's forward
when the estimator is marked ``hidden_rank = True``; ``batch.extras["hidden_rank"]``, (N, 3)):

* **ER**, the effective rank of the completion's final-layer hidden states H (T × d; the final norm's output at each
  decoding step, i.e. at the completion's tokens but the last): with σ the singular values of H centred over its
  rows, p = σ / Σσ, ER = exp(−Σ p log p) (the released code's ``compute_single_effective_rank``).
* **ERV / ERA**, its first and second differences along the sequence: ER_j is the effective rank of the prefix of
  the first j·s + 1 hidden states (s the ``stride``, j = 1, 2, … while j·s < T); Δ_j = ER_j − mean(ER_1 … ER_{j−1})
  (j ≥ 2), Δ²_j = Δ_j − Δ_{j−1} (j ≥ 3); ERV = mean Δ, ERA = mean Δ² (0 where too short) — the released
  ``calculate_diffs_for_single_sample_optimized`` and ``_aggregate_diffs``.

The shaping (the released ``RewardManager`` in its ``PlanB`` mode and ``compute_advantage`` with ``add_adv``), with
m_k the exponential moving average over training steps of the batch mean of indicator k ∈ {ERA, ERV, ER}:

    d_k = clamp((x_k − m_k) / (|m_k| + 1e-8), −5, 5)                      relative deviation from the running level
    τ = sigmoid(g · d_ERA)                                               ERA, the meta-controller
    w = τ · w_explore + (1 − τ) · w_exploit                              w_explore = ER only, w_exploit = ERV only
    b = λ · Σ_k w_k · tanh(d_k)                                           the auxiliary signal (λ the fixed weight)
    A = A_GRPO + min(relu(b), |A_GRPO| / κ)                              dual channel, capped at |A|/κ

A completion whose hidden states spread over more dimensions than usual (ER up: exploration) or whose rank grows
faster than usual (ERV up: exploitation gain) gets its advantage raised, which one is chosen per completion by
whether its rank is accelerating (ERA) — and never by more than |A|/κ, so the sign and the order of the task signal
stand.
"""

from __future__ import annotations

import inspect

import torch

from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import HIDDEN_RANK
from rlexp.core.registry import ADVANTAGES

from .group import normalize_rewards

DEVIATION_CLAMP = 5.0  # the released code's clamp of the relative deviations
EPS = 1e-8


def effective_rank(h: torch.Tensor, mask: torch.Tensor, center: bool = True) -> torch.Tensor:
    """(B,) effective rank exp(H(σ/Σσ)) of each row's (T, d) matrix of valid vectors ``h[b][mask[b]]`` (``center``:
    minus their mean first). Computed in float64 from the smaller Gram matrix (padding rows are zero after masking
    and add no singular value). Fewer than 2 valid vectors: 0 (as the released code)."""
    m = mask.to(torch.float64)
    x = h.to(torch.float64) * m[..., None]
    n = m.sum(-1)
    if center:
        mean = x.sum(1) / n.clamp(min=1)[:, None]
        x = (x - mean[:, None, :]) * m[..., None]
    t, d = x.shape[1], x.shape[2]
    gram = x @ x.transpose(1, 2) if t <= d else x.transpose(1, 2) @ x
    eig = torch.linalg.eigvalsh(gram).clamp(min=0.0)
    sigma = eig.sqrt()
    total = sigma.sum(-1, keepdim=True)
    p = sigma / total.clamp(min=1e-300)
    ent = -torch.where(p > 0, p * p.clamp(min=1e-300).log(), torch.zeros_like(p)).sum(-1)
    er = ent.exp()
    er = torch.where(total.squeeze(-1) > 0, er, torch.ones_like(er))  # all-zero matrix: one (degenerate) direction
    return torch.where(n >= 2, er, torch.zeros_like(er))


def rank_dynamics(er_windows: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) ERV and ERA from each row's effective ranks of its growing prefixes ``er_windows`` (B, J) (``valid``:
    (B, J) bool, a prefix of each row): Δ_j = ER_j − mean(ER_<j), Δ²_j = Δ_j − Δ_{j−1}, their means over the row."""
    v = valid.to(torch.float64)
    e = er_windows.to(torch.float64) * v
    csum = torch.cumsum(e, 1)
    count = torch.arange(1, e.shape[1] + 1, device=e.device, dtype=torch.float64)
    prev_mean = torch.zeros_like(e)
    prev_mean[:, 1:] = csum[:, :-1] / count[:-1]
    d1 = (e - prev_mean) * v
    d1_valid = v.clone()
    d1_valid[:, 0] = 0
    d2 = torch.zeros_like(e)
    d2[:, 2:] = d1[:, 2:] - d1[:, 1:-1]
    d2_valid = torch.zeros_like(v)
    d2_valid[:, 2:] = v[:, 2:]
    erv = (d1 * d1_valid).sum(1) / d1_valid.sum(1).clamp(min=1)
    era = (d2 * d2_valid).sum(1) / d2_valid.sum(1).clamp(min=1)
    return erv, era


def rank_statistics(hidden: torch.Tensor, mask: torch.Tensor, stride: int, center: bool = True) -> torch.Tensor:
    """(B, 3) [ER, ERV, ERA] of each completion from ``hidden`` (B, T, d), the final hidden state that predicts each
    completion token (row t predicts token t), and the completion mask (B, T). The decoding steps' states are rows
    1 … T−1 (their inputs are completion tokens); valid tokens are moved to the front of each row first."""
    if stride < 1:
        raise ValueError(f"algorithm.advantage.stride={stride} must be >= 1")
    h, m = hidden[:, 1:], mask[:, 1:].bool() & mask[:, :-1].bool()
    order = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices  # valid positions first, in order
    h = h.gather(1, order[..., None].expand_as(h))
    m = m.gather(1, order)
    lengths = m.sum(1)
    er = effective_rank(h, m, center)
    steps = list(range(stride, int(lengths.max()) if lengths.numel() else 0, stride))
    if not steps:
        zeros = torch.zeros_like(er)
        return torch.stack([er, zeros, zeros], 1).float()
    windows, valid = [], []
    for t in steps:  # the prefix of the first t + 1 states, kept for the rows longer than t + 1
        windows.append(effective_rank(h[:, : t + 1], m[:, : t + 1], center))
        valid.append(lengths > t)
    erv, era = rank_dynamics(torch.stack(windows, 1), torch.stack(valid, 1))
    return torch.stack([er, erv, era], 1).float()


LEVELS = ("er", "erv", "era")


def update_levels(levels: dict, stats: torch.Tensor, ema_alpha: float) -> None:
    """The running levels m_k of ER, ERV and ERA, in place: an exponential moving average over training steps of
    each step's batch mean, m ← (1 − a)·m + a·mean (a = ``ema_alpha``), set to the first step's means."""
    means = stats.double().mean(0).tolist()
    for key, mean in zip(LEVELS, means):
        levels[key] = mean if key not in levels else (1 - ema_alpha) * levels[key] + ema_alpha * mean


def dual_channel_bonus(
    stats: torch.Tensor,
    levels: dict,
    gain: float,
    explore: tuple[float, float, float],
    exploit: tuple[float, float, float],
    weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) the auxiliary signal b and (N,) the tendency τ from (N, 3) [ER, ERV, ERA] statistics and their running
    levels {er, erv, era}; ``explore`` / ``exploit`` are the weight vectors over (ERA, ERV, ER) — the released order."""
    x = stats.double()[:, [2, 1, 0]]  # (ERA, ERV, ER)
    lv = torch.tensor([levels["era"], levels["erv"], levels["er"]], dtype=torch.float64, device=x.device)
    dev = ((x - lv) / (lv.abs() + EPS)).clamp(-DEVIATION_CLAMP, DEVIATION_CLAMP)
    tendency = torch.sigmoid(gain * dev[:, 0])
    w_e = torch.tensor(explore, dtype=torch.float64, device=x.device)
    w_x = torch.tensor(exploit, dtype=torch.float64, device=x.device)
    w = tendency[:, None] * w_e + (1.0 - tendency[:, None]) * w_x
    return weight * (w * torch.tanh(dev)).sum(1), tendency


@ADVANTAGES.register
def verl_rank(
    batch: RolloutBatch,
    stride: int = 40,
    center: bool = True,
    kappa: float = 2.0,
    modulation_gain: float = 2.0,
    weight: float = 1.0,
    explore_weights: tuple = (0.0, 0.0, 1.0),
    exploit_weights: tuple = (0.0, 1.0, 0.0),
    ema_alpha: float = 0.3,
    levels: dict | None = None,
    scale: str = "group",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> torch.Tensor:
    """(N,) GRPO advantages plus VERL's capped hidden-rank bonus (see the module doc). ``stride`` and ``center``
    are read by the trainer's forward (``Algorithm.advantage_hidden_rank``). ``levels``: the dict that keeps the
    running levels across steps (the config gives an empty one; the estimator fills it)."""
    if kappa <= 0:
        raise ValueError(f"algorithm.advantage.kappa={kappa} must be > 0")
    if len(explore_weights) != 3 or len(exploit_weights) != 3:
        raise ValueError("algorithm.advantage.explore_weights and exploit_weights are 3 weights over (ERA, ERV, ER)")
    if not 0.0 < ema_alpha <= 1.0:
        raise ValueError(f"algorithm.advantage.ema_alpha={ema_alpha} must be in (0, 1]")
    if not isinstance(levels, dict):
        raise ValueError(
            "algorithm.advantage.levels must be a dict ({} in the config): VERL's deviations are taken from running "
            "levels the estimator keeps in it across steps"
        )
    stats = batch.extras.get(HIDDEN_RANK)
    if stats is None:
        raise ValueError(
            "algorithm.advantage needs batch.extras['hidden_rank'] (the trainer computes it in the old policy's "
            "forward for an advantage marked hidden_rank = True)"
        )
    adv = normalize_rewards(batch.reward, batch.group_ids, scale=scale, eps=eps, singleton=singleton)
    stats = stats.to(adv.device)
    bonus = torch.zeros_like(adv)
    if all(k in levels for k in LEVELS):  # from the second step on
        aux, tendency = dual_channel_bonus(
            stats, levels, modulation_gain, tuple(explore_weights), tuple(exploit_weights), weight
        )
        bonus = torch.minimum(aux.clamp(min=0).to(adv.dtype), adv.abs() / kappa)
        batch.stats["verl/aux_mean"] = float(aux.mean())
        batch.stats["verl/explore_tendency_mean"] = float(tendency.mean())
        batch.stats["verl/bonus_active_frac"] = float((bonus > 0).float().mean())
    update_levels(levels, stats, ema_alpha)
    batch.stats["verl/effective_rank_mean"] = float(stats[:, 0].mean())
    batch.stats["verl/erv_mean"] = float(stats[:, 1].mean())
    batch.stats["verl/era_mean"] = float(stats[:, 2].mean())
    batch.stats["verl/shaping_abs_mean"] = float(bonus.abs().mean())
    return adv + bonus


verl_rank.hidden_rank = True  # reads batch.extras["hidden_rank"] (Algorithm.advantage_hidden_rank)


def hidden_rank_settings(advantage) -> dict | None:
    """{stride, center} of an estimator marked ``hidden_rank = True`` (its partial's values, else its defaults);
    None for any other estimator."""
    fn = advantage
    while hasattr(fn, "func"):
        fn = fn.func
    if not getattr(fn, "hidden_rank", False):
        return None
    params = inspect.signature(fn).parameters
    given = getattr(advantage, "keywords", None) or {}
    out = {k: given.get(k, params[k].default) for k in ("stride", "center")}
    if int(out["stride"]) < 1:
        raise ValueError(f"algorithm.advantage.stride={out['stride']} must be >= 1")
    return {"stride": int(out["stride"]), "center": bool(out["center"])}
