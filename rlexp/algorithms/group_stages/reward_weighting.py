"""Dynamic reward weighting — "Learning to Optimize Multi-Objective Alignment Through Dynamic Reward Weighting" (Lu et
al., 2025; arXiv 2509.11452; released code github.com/yining610/dynamic-reward-weighting): the weights of a linear
scalarisation Σ_k w_k·r_k of several reward terms change during online RL instead of staying fixed.

Two variants (``variant``), as the released code runs them:

``hypervolume`` (hypervolume-guided weight adaptation): the policy's performance point p (one coordinate per
objective) is compared with a buffer of earlier points, the first of which is the reference (the initial policy's
point). Its hypervolume contribution c = HV(front ∪ {p}) − HV(front) (maximisation, measured from the reference) sets
a meta reward m = 0.5 + 1.5·tanh(c) that multiplies every weight of the step; a point with c > 0 joins the front. A
step that extends the Pareto front is rewarded up to 2×, one that does not is halved (m = 0.5). The released code
measures p on a validation split after each update and uses m at the next step; here p is the step's own rollout
batch mean of each term — the batch of step t is sampled from the weights after update t − 1, so p and m meet at the
same point of training. A common factor on every weight cancels in GRPO's group-std normalisation: use an advantage
that only centres (Dr. GRPO's), as conf/algorithm/dynamic_weights_hv.yaml does.

``gradient`` (gradient-based weight optimisation): each term's own policy gradient g_k (the gradient of the
on-policy surrogate −A_k·log π with A_k the term's group-normalised advantage, each clipped to norm ≤ ``grad_clip``)
is taken on the step's batch; the term's influence s_k = Σ_j g_k·g_j (its row of the gradient Gram matrix: how much
a step along g_k also moves the other objectives) drives a mirror-descent step on the simplex,

    w ← softmax(log w + η·s)        (η = ``step_size``, the released code's lr / regularization_factor),

before the step's rewards are formed with the new weights. The weights live on a simplex scaled by the configured
weights' total S (S = 1: the released code's simplex), so the reward keeps the scale of the reward config.

Metrics: ``reward_weights/<term>`` (the weight each term gets at the step), and per variant
``dynamic_weights/meta_reward``, ``dynamic_weights/hv_contribution``, ``dynamic_weights/front_size`` or
``dynamic_weights/influence/<term>``. The weights, the front and the meta reward are kept in checkpoints.
"""

from __future__ import annotations

import math
import re

import torch

from rlexp.algorithms.advantages.group import SCALES, normalize_rewards
from rlexp.algorithms.group_stages.base import stage_setting
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import token_logprobs
from rlexp.core.registry import GROUP_STAGES

VARIANTS = ("hypervolume", "gradient")


def hypervolume(points: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    """Volume of the region that dominates ``ref`` and is dominated by some point (every objective maximised). Exact,
    by slicing along the first objective (the recursion of Fonseca et al., 2006); points that do not dominate ``ref``
    in every objective add nothing."""
    pts = [tuple(p) for p in points if all(x > r for x, r in zip(p, ref))]
    if not pts:
        return 0.0
    if len(ref) == 1:
        return max(p[0] for p in pts) - ref[0]
    total, lower = 0.0, ref[0]
    for level in sorted({p[0] for p in pts}):
        above = [p[1:] for p in pts if p[0] >= level]
        total += (level - lower) * hypervolume(above, ref[1:])
        lower = level
    return total


def hv_contribution(front: list[tuple[float, ...]], point: tuple[float, ...], ref: tuple[float, ...]) -> float:
    """HV(front ∪ {point}) − HV(front), from ``ref`` (≥ 0)."""
    return max(0.0, hypervolume([*front, point], ref) - hypervolume(front, ref))


@GROUP_STAGES.register
class DynamicRewardWeights:
    """Group stage: the reward terms' weights adapt during training (see the module doc).

    ``variant``: ``hypervolume`` | ``gradient``. ``terms``: the weighted terms (null: every reward term with a non-zero
    weight in the reward config; terms outside the list keep their weights). ``init_weights``: {term: weight} to start
    from (null: the reward config's). Hypervolume: ``meta_offset`` + ``meta_scale``·tanh(c) (the released 0.5, 1.5).
    Gradient: ``step_size`` η, ``grad_clip`` (per-term gradient norm cap; null: none), ``advantage_scale`` of each
    term's advantage (group | batch | none), ``params``: a regular expression on parameter names whose gradients
    enter the Gram matrix (null: every trainable parameter; the released code takes decoder layers 10-25 of 36)."""

    needs_reference = False

    def __init__(
        self,
        variant: str = "gradient",
        terms: list | None = None,
        init_weights: dict | None = None,
        meta_offset: float = 0.5,
        meta_scale: float = 1.5,
        step_size: float = 0.1,
        grad_clip: float | None = 1.0,
        advantage_scale: str = "group",
        params: str | None = None,
        eps: float = 1e-6,
    ):
        where = "algorithm.group_stages: DynamicRewardWeights"
        if variant not in VARIANTS:
            raise ValueError(f"{where}.variant={variant!r} is not one of {list(VARIANTS)}")
        if step_size <= 0:
            raise ValueError(f"{where}.step_size={step_size} must be > 0")
        if grad_clip is not None and grad_clip <= 0:
            raise ValueError(f"{where}.grad_clip={grad_clip} must be > 0 or null")
        if meta_scale < 0 or meta_offset < 0:
            raise ValueError(f"{where}: meta_offset={meta_offset} and meta_scale={meta_scale} must be >= 0")
        if advantage_scale not in SCALES:
            raise ValueError(f"{where}.advantage_scale={advantage_scale!r} is not one of {list(SCALES)}")
        if terms is not None and len(terms) == 0:
            raise ValueError(f"{where}.terms is empty (null: every reward term with a non-zero weight)")
        if init_weights is not None:
            init_weights = {str(k): float(v) for k, v in dict(init_weights).items()}
            if any(v <= 0 or not math.isfinite(v) for v in init_weights.values()):
                raise ValueError(f"{where}.init_weights={init_weights} must all be finite and > 0")
        try:
            self.params = re.compile(params) if params else None
        except re.error as e:
            raise ValueError(f"{where}.params={params!r}: {e}") from e
        self.variant = variant
        self.terms = [str(t) for t in terms] if terms is not None else None
        self.init_weights = init_weights
        self.meta_offset, self.meta_scale = float(meta_offset), float(meta_scale)
        self.step_size, self.grad_clip = float(step_size), None if grad_clip is None else float(grad_clip)
        self.advantage_scale, self.eps = advantage_scale, float(eps)
        self.weights: dict[str, float] | None = None  # the weights in use (set at the first step)
        self.front: list[list[float]] = []  # hypervolume: [reference point, then the points that extended the front]
        self.meta = 1.0

    # ---- the weights ------------------------------------------------------------------------------------------
    def _managed(self, batch: RolloutBatch) -> list[str]:
        names = self.terms
        if names is None:
            w = batch.reward_weights.tolist() if batch.reward_weights is not None else [1.0] * len(batch.reward_names)
            names = [n for n, wj in zip(batch.reward_names, w) if wj != 0.0]
            if not names:
                raise ValueError("algorithm.group_stages: DynamicRewardWeights: every reward term has weight 0")
        missing = [t for t in names if t not in batch.reward_names]
        if missing:
            raise KeyError(
                f"algorithm.group_stages: DynamicRewardWeights.terms {missing} are not reward terms "
                f"(terms: {batch.reward_names})"
            )
        return names

    def _start(self, batch: RolloutBatch, names: list[str]) -> None:
        if self.weights is not None and set(self.weights) == set(names):
            return
        if self.init_weights is not None:
            if set(self.init_weights) != set(names):
                raise KeyError(
                    f"algorithm.group_stages: DynamicRewardWeights.init_weights names {sorted(self.init_weights)}, "
                    f"the weighted terms are {names}"
                )
            self.weights = {t: self.init_weights[t] for t in names}
        else:
            w = batch.reward_weights
            self.weights = {t: float(w[batch.reward_names.index(t)]) if w is not None else 1.0 for t in names}
        if any(v <= 0 for v in self.weights.values()):
            raise ValueError(
                f"algorithm.group_stages: DynamicRewardWeights needs positive starting weights, got {self.weights} "
                "(set init_weights, or list the terms to weight in terms)"
            )

    def __call__(self, batch: RolloutBatch, ctx=None) -> RolloutBatch:
        names = self._managed(batch)
        self._start(batch, names)
        if self.variant == "hypervolume":
            used = self._hypervolume_step(batch, names)
        else:
            used = self._gradient_step(batch, names, ctx)
        cols = [batch.reward_names.index(t) for t in names]
        old = batch.reward_weights.clone()
        new = old.clone()
        for t, j in zip(names, cols):
            new[j] = used[t]
        delta = batch.rewards[:, cols].float() @ (new[cols] - old[cols]).float()
        batch.reward_weights = new
        batch.reward = batch.reward + delta.to(batch.reward.dtype)
        for t in names:
            batch.stats[f"reward_weights/{t}"] = float(used[t])
        return batch

    # ---- hypervolume-guided adaptation ------------------------------------------------------------------------
    def _hypervolume_step(self, batch: RolloutBatch, names: list[str]) -> dict[str, float]:
        point = [float(batch.term(t).float().mean()) for t in names]
        if not self.front:  # the first point is the reference: nothing to compare with yet, m = 1
            self.front = [point]
            c = 0.0
        else:
            ref, front = tuple(self.front[0]), [tuple(p) for p in self.front[1:]]
            c = hv_contribution(front, tuple(point), ref)
            self.meta = self.meta_offset + self.meta_scale * math.tanh(c)
            if c > 0:
                self.front.append(point)
        batch.stats["dynamic_weights/meta_reward"] = self.meta
        batch.stats["dynamic_weights/hv_contribution"] = c
        batch.stats["dynamic_weights/front_size"] = float(len(self.front) - 1)
        return {t: self.weights[t] * self.meta for t in names}

    # ---- gradient-based optimisation --------------------------------------------------------------------------
    def term_gradients(self, batch: RolloutBatch, names: list[str], ctx) -> torch.Tensor:
        """(R, R) Gram matrix G_kj = g_k·g_j of the terms' policy gradients on ``batch`` (see the module doc)."""
        model = getattr(ctx, "policy", None)
        if model is None:
            raise ValueError("algorithm.group_stages: DynamicRewardWeights(variant=gradient) needs the policy (ctx)")
        params = [
            p for n, p in model.named_parameters() if p.requires_grad and (self.params is None or self.params.search(n))
        ]
        if not params:
            raise ValueError(
                f"algorithm.group_stages: DynamicRewardWeights.params={self.params.pattern!r} matches none"
            )
        device = next(model.parameters()).device
        adv = torch.stack(
            [normalize_rewards(batch.term(t).float(), batch.group_ids, self.advantage_scale, self.eps) for t in names],
            1,
        ).to(device)  # (N, R)
        mask = batch.completion_mask.to(device).float()
        total_tokens = mask.sum().clamp(min=1.0)
        temperature = float(getattr(getattr(ctx, "rollout", None), "temperature", None) or 1.0)
        micro = int(stage_setting(ctx, "micro_batch_size", len(batch)) or len(batch))
        grads = [[torch.zeros_like(p) for p in params] for _ in names]
        for start in range(0, len(batch), micro):
            rows = slice(start, start + micro)
            logp, _ = token_logprobs(
                model,
                batch.prompt_ids[rows].to(device),
                batch.prompt_mask[rows].to(device),
                batch.completion_ids[rows].to(device),
                batch.completion_mask[rows].to(device),
                temperature,
                autocast_dtype=getattr(ctx, "autocast_dtype", None),
                share_prompts=False,
            )
            seq = (logp.float() * mask[rows]).sum(-1)  # Σ_t log π per row
            for k in range(len(names)):
                # token-mean surrogate over the batch: its gradient is the on-policy (ratio 1) clipped-loss gradient
                objective = (adv[rows, k] * seq).sum() / total_tokens
                g = torch.autograd.grad(objective, params, retain_graph=k < len(names) - 1, allow_unused=True)
                for acc, gi in zip(grads[k], g):
                    if gi is not None:
                        acc += gi.detach()
        flat = torch.stack([torch.cat([g.flatten().float() for g in gk]) for gk in grads])  # (R, P)
        if self.grad_clip is not None:
            norms = flat.norm(dim=1, keepdim=True)
            flat = flat * (self.grad_clip / (norms + 1e-6)).clamp(max=1.0)
        return flat @ flat.T

    def _gradient_step(self, batch: RolloutBatch, names: list[str], ctx) -> dict[str, float]:
        gram = self.term_gradients(batch, names, ctx).double().cpu()
        influence = gram.sum(1)
        w = torch.tensor([self.weights[t] for t in names], dtype=torch.float64)
        mass = float(w.sum())
        new = mass * torch.softmax(torch.log(w / mass) + self.step_size * influence, 0)
        self.weights = {t: float(v) for t, v in zip(names, new)}
        for t, s in zip(names, influence.tolist()):
            batch.stats[f"dynamic_weights/influence/{t}"] = float(s)
        return dict(self.weights)

    # ---- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"weights": dict(self.weights or {}), "front": [list(p) for p in self.front], "meta": self.meta}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:
            return
        self.weights = {k: float(v) for k, v in state.get("weights", {}).items()} or None
        self.front = [[float(x) for x in p] for p in state.get("front", [])]
        self.meta = float(state.get("meta", 1.0))
