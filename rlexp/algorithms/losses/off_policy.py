"""Losses of the SFT–RL hybrids, on batches that hold demonstration rows (``extras["demonstration"]``, added by
``rlexp.algorithms.group_stages.demonstrations.Demonstrations``); both wrap an on-policy loss (``inner``, e.g. the
clipped surrogate) that keeps the rollouts.

* ``PolicyShaping`` — LUFFY ("Learning to Reason under Off-Policy Guidance", Yan et al., 2025; arXiv 2504.14945;
  released code ElliottYan/LUFFY, ``mix_core_alg.compute_token_on_off_policy_loss``, ``off_policy_reshape=
  "p_div_p_0.1"``): on a demonstration token the loss is −A·f(r) with r = π_θ/π_φ (π_φ = 1: the demonstration rows'
  sampling log-probs are 0, so r = π_θ) and f(p) = p/(p + γ), no clip. Its gradient with respect to log π is
  −A·γ·p/(p + γ)²: low-probability tokens of the demonstration, which a plain importance weight p would all but
  ignore, keep a large weight (regularised importance sampling). Rollout tokens keep ``inner``.
* ``Chord`` — CHORD ("On-Policy RL Meets Off-Policy Experts: Harmonizing SFT and RL via Dynamic Weighting", Zhang et
  al., 2025; arXiv 2508.11408; released in modelscope/Trinity-RFT as the ``mix_chord`` policy loss):
  L = (1 − μ)·L_RL + μ·L_SFT, L_RL the token mean of ``inner`` over the rollout tokens, L_SFT the token mean over
  the expert tokens of −φ·log π, φ = p·(1 − p) with p = π_θ (detached; CHORD-φ) or φ = 1 (``phi=False``: plain
  NLL, CHORD-μ); μ scheduled over training (``mu_schedule``).
* ``MultipleImportanceSampling`` — RL-PLUS ("RL-PLUS: Countering Capability Boundary Collapse of LLMs in
  Reinforcement Learning with Hybrid-policy Optimization", Dong et al., 2025; arXiv 2508.00222; released code
  YihongDong/RL-PLUS, ``rlplus_core_alg.compute_token_on_off_policy_loss``, ``off_policy_strategy="RL-PLUS"``): a
  demonstration token e_t was written by an unknown expert π_ω, so its ratio's denominator is the mixture of the two
  behaviour policies (multiple importance sampling, balance heuristic): r = π_θ / (α·π_old + (1 − α)·π̂_ω), with
  π̂_ω = w·π_old + (1 − w)·1 the released estimate of the unknown expert (α = w = ½: r = π_θ / (¾·π_old + ¼), bounded
  by 4); the token's loss is −r·A·C with RL-PLUS's exploration-based weight C = (1 − π_θ)^γ (π_θ detached, γ = ½),
  which keeps the gradient on the correct paths the policy finds unlikely. No clip. Rollout tokens keep ``inner``.

The per-part token means: the trainer aggregates the per-token loss l as Σ l·m / N (``aggregation: token-mean``; N
the loss tokens of the optimiser step's mini-batch). The stage sets each row's weight w = N / N_part
(``extras["demo_part_weight"]``; the part: expert rows or rollouts), so Σ_t l·w·m / N = Σ_rollouts l·m / N_RL +
Σ_experts l·m / N_SFT: each part is its own token mean, whatever the share of tokens of each. The counts are the
whole step's, so with one optimiser step per rollout (CHORD's, and ours) they are exact; with several mini-batches
they hold on average. The same weights make the per-part metrics (``chord/sft_loss``, ``luffy/*``) means over
their part's tokens (the trainer divides every token statistic by all loss tokens).
"""

from __future__ import annotations

import math

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.masks import DEMO_PART_WEIGHT, DEMONSTRATION, PRECEDENT
from rlexp.core.registry import LOSSES


def shaping(p: torch.Tensor, gamma: float) -> torch.Tensor:
    """LUFFY's policy shaping f(p) = p / (p + γ)."""
    return p / (p + gamma)


def mu_schedule(step: int, warmup_steps: int, decay_steps: int, peak: float, valley: float) -> float:
    """CHORD's μ at 0-based ``step`` (the released ``mu_schedule_function``): linear 0 → ``peak`` over
    ``warmup_steps``, then cosine ``peak`` → ``valley`` over ``decay_steps``, then ``valley``."""
    if step < warmup_steps:
        return step / warmup_steps * peak
    if step >= warmup_steps + decay_steps:
        return valley
    t = step - warmup_steps
    return (peak - valley) * 0.5 * (1.0 + math.cos(math.pi * t / decay_steps)) + valley


def _rows(flag: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return flag.to(device=like.device, dtype=torch.bool)[:, None].expand_as(like)


def _rollout_stats(stats: dict[str, torch.Tensor], demo: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inner loss's statistics on the rollout tokens only: the demonstration tokens count as unclipped (0) and,
    for ``ratio/mean`` (whose extremes the trainer takes too), as ratio 1."""
    out = {}
    for key, v in stats.items():
        out[key] = torch.where(demo, torch.ones_like(v), v) if key == "ratio/mean" else v * ~demo
    return out


@LOSSES.register
class PolicyShaping:
    """LUFFY's mixed-policy loss: ``inner`` (the clipped surrogate) on rollout tokens, −A·f(π_θ/π_φ) with
    f(p) = p/(p + ``gamma``) and no clip on demonstration tokens (see the module doc).

    Stats, means over the demonstration tokens: ``luffy/shaped_weight_mean`` (γ·p/(p + γ)², the weight of −A·∇log π
    the shaping gives a token; a plain importance weight would give p), ``luffy/f_mean`` (f(p)), ``luffy/prob_mean``
    (p = π_θ); ``luffy/demo_token_frac`` (their share of the loss tokens)."""

    batch_extras = (DEMONSTRATION, DEMO_PART_WEIGHT)
    stage_extras = (DEMONSTRATION, DEMO_PART_WEIGHT)  # a group stage must set them (Demonstrations)

    def __init__(self, inner, gamma: float = 0.1):
        if not callable(inner):
            raise ValueError(
                "loss PolicyShaping.inner must be a policy loss (e.g. rlexp.algorithms.losses.clip.ppo_clip)"
            )
        if gamma <= 0:
            raise ValueError(f"loss PolicyShaping.gamma={gamma} must be > 0")
        self.inner, self.gamma = inner, float(gamma)

    def __call__(self, logp, old_logp, advantages, mask, demonstration, demo_part_weight) -> LossOutput:
        out = self.inner(logp, old_logp, advantages, mask)
        demo = _rows(demonstration, logp)
        adv = expand_like(advantages, logp)
        ratio = torch.exp(logp - old_logp)  # π_θ / π_φ; π_φ = 1 on the demonstration rows
        f = shaping(ratio, self.gamma)
        per_token = torch.where(demo, -adv * f, out.per_token)
        stats = _rollout_stats(out.token_stats, demo)
        scale = demo_part_weight.to(logp.dtype)[:, None] * demo  # per-part token means (module doc)
        p = ratio.detach()
        stats["luffy/shaped_weight_mean"] = self.gamma * p / (p + self.gamma) ** 2 * scale
        stats["luffy/f_mean"] = f.detach() * scale
        stats["luffy/prob_mean"] = p * scale
        stats["luffy/demo_token_frac"] = demo.float()
        return LossOutput(per_token, stats)


@LOSSES.register
class Chord:
    """CHORD's loss: (1 − μ)·(token mean of ``inner`` over the rollouts) + μ·(token mean of −φ·log π over the expert
    rows), φ = p(1 − p) detached (``phi``; false: φ = 1) — see the module doc. μ = ``mu_schedule`` at the train step
    (0-based: step k of the run is k − 1), set by ``on_step`` before each update: linear warm-up 0 → ``mu_peak`` over
    ``mu_warmup_steps``, cosine ``mu_peak`` → ``mu_valley`` over ``mu_decay_steps``, then ``mu_valley``. Needs
    ``aggregation: token-mean`` (the per-part weights divide by the token count).

    Stats: ``chord/mu``, and means over the expert tokens: ``chord/sft_loss`` (−φ·log π, before μ), ``chord/phi_mean``
    (φ); ``chord/expert_token_frac`` (their share of the loss tokens)."""

    batch_extras = (DEMONSTRATION, DEMO_PART_WEIGHT)
    stage_extras = (DEMONSTRATION, DEMO_PART_WEIGHT)
    required_aggregation = "token-mean"

    def __init__(
        self,
        inner,
        mu_peak: float = 0.9,
        mu_valley: float = 0.05,
        mu_warmup_steps: int = 0,
        mu_decay_steps: int = 0,
        phi: bool = True,
    ):
        if not callable(inner):
            raise ValueError("loss Chord.inner must be a policy loss (e.g. rlexp.algorithms.losses.clip.ppo_clip)")
        for name, v in (("mu_peak", mu_peak), ("mu_valley", mu_valley)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"loss Chord.{name}={v} must be in [0, 1]")
        for name, v in (("mu_warmup_steps", mu_warmup_steps), ("mu_decay_steps", mu_decay_steps)):
            if v < 0:
                raise ValueError(f"loss Chord.{name}={v} must be >= 0")
        self.inner, self.phi = inner, bool(phi)
        self.mu_peak, self.mu_valley = float(mu_peak), float(mu_valley)
        self.mu_warmup_steps, self.mu_decay_steps = int(mu_warmup_steps), int(mu_decay_steps)
        self.mu = self.mu_at(0)  # μ of the update in progress

    def mu_at(self, step: int) -> float:
        """μ at 0-based ``step``."""
        return mu_schedule(step, self.mu_warmup_steps, self.mu_decay_steps, self.mu_peak, self.mu_valley)

    def on_step(self, step: int, max_steps: int) -> None:
        """Set μ for train step ``step`` (1-based)."""
        self.mu = self.mu_at(step - 1)

    def __call__(self, logp, old_logp, advantages, mask, demonstration, demo_part_weight) -> LossOutput:
        out = self.inner(logp, old_logp, advantages, mask)
        demo = _rows(demonstration, logp)
        w = demo_part_weight.to(logp.dtype)[:, None]
        p = torch.exp(logp.detach())
        phi = p * (1.0 - p) if self.phi else torch.ones_like(p)
        sft = -phi * logp
        per_token = torch.where(demo, self.mu * w * sft, (1.0 - self.mu) * w * out.per_token)
        stats = _rollout_stats(out.token_stats, demo)
        expert = w * demo
        stats["chord/mu"] = torch.full_like(p, self.mu)
        stats["chord/sft_loss"] = sft.detach() * expert
        stats["chord/phi_mean"] = phi * expert
        stats["chord/expert_token_frac"] = demo.float()
        return LossOutput(per_token, stats)


def mis_ratio(logp: torch.Tensor, old_logp: torch.Tensor, alpha: float, expert_old_weight: float) -> torch.Tensor:
    """RL-PLUS's multiple-importance-sampling ratio of a demonstration token: π_θ / (α·π_old + (1 − α)·π̂_ω) with the
    unknown expert's probability estimated as π̂_ω = w·π_old + (1 − w)·1 (w = ``expert_old_weight``)."""
    p_old = torch.exp(old_logp)
    expert = expert_old_weight * p_old + (1.0 - expert_old_weight)
    return torch.exp(logp) / (alpha * p_old + (1.0 - alpha) * expert)


def exploration_weight(p: torch.Tensor, gamma: float) -> torch.Tensor:
    """RL-PLUS's exploration-based advantage factor C = (1 − p)^γ (p = π_θ of the token, detached)."""
    return (1.0 - p).clamp(min=0.0) ** gamma


@LOSSES.register
class MultipleImportanceSampling:
    """RL-PLUS's hybrid-policy loss: ``inner`` (the clipped surrogate) on rollout tokens; on demonstration tokens
    −r·A·C with the multiple-importance-sampling ratio r = π_θ / (α·π_old + (1 − α)·π̂_ω) (``mis_ratio``) and the
    exploration-based advantage A·C, C = (1 − π_θ)^γ (``exploration_weight``; γ = 0: C = 1, MIS alone), no clip (see
    the module doc).

    The exploration weight lives here, not in an advantage estimator: it is the *current* policy's probability of
    the token, detached, recomputed by each optimiser step's forward (the released code's, inside its loss), which an
    estimator — run once before the update — does not have; and it acts on the demonstration tokens only, which the
    loss separates. π_old on the demonstration rows is read from ``extras["precedent_logprobs"]`` (the weights the
    update starts from): their ``old_logprobs`` are their sampling log-probs (0), the ratio's denominator of LUFFY,
    not the policy's. ``needs_old_forward``: the trainer computes them with a forward even for a single optimiser
    step.

    Stats, means over the demonstration tokens: ``rlplus/mis_ratio_mean`` (r), ``rlplus/exploration_weight_mean``
    (C), ``rlplus/prob_mean`` (π_θ), ``rlplus/old_prob_mean`` (π_old); ``rlplus/demo_token_frac`` (their share of
    the loss tokens)."""

    batch_extras = (DEMONSTRATION, DEMO_PART_WEIGHT, PRECEDENT)
    stage_extras = (DEMONSTRATION, DEMO_PART_WEIGHT)  # a group stage must set them (Demonstrations)
    needs_old_forward = True  # π_old on every row, demonstrations included (rlexp.trainer.loop)

    def __init__(self, inner, alpha: float = 0.5, expert_old_weight: float = 0.5, gamma: float = 0.5):
        if not callable(inner):
            raise ValueError(
                "loss MultipleImportanceSampling.inner must be a policy loss "
                "(e.g. rlexp.algorithms.losses.clip.ppo_clip)"
            )
        for name, v in (("alpha", alpha), ("expert_old_weight", expert_old_weight)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"loss MultipleImportanceSampling.{name}={v} must be in [0, 1]")
        if gamma < 0:
            raise ValueError(f"loss MultipleImportanceSampling.gamma={gamma} must be >= 0")
        self.inner, self.alpha, self.expert_old_weight, self.gamma = (
            inner,
            float(alpha),
            float(expert_old_weight),
            gamma,
        )

    def __call__(
        self, logp, old_logp, advantages, mask, demonstration, demo_part_weight, precedent_logprobs=None
    ) -> LossOutput:
        if precedent_logprobs is None:
            raise ValueError(
                "loss MultipleImportanceSampling reads the old policy's log-probs of the demonstration rows "
                "(batch.extras['precedent_logprobs'], set by the trainer)"
            )
        out = self.inner(logp, old_logp, advantages, mask)
        demo = _rows(demonstration, logp)
        adv = expand_like(advantages, logp)
        old = precedent_logprobs.to(logp.dtype)
        ratio = mis_ratio(logp, old, self.alpha, self.expert_old_weight)
        p = torch.exp(logp.detach())
        c = exploration_weight(p, self.gamma)
        per_token = torch.where(demo, -ratio * adv * c, out.per_token)
        stats = _rollout_stats(out.token_stats, demo)
        scale = demo_part_weight.to(logp.dtype)[:, None] * demo  # means over the demonstration tokens
        stats["rlplus/mis_ratio_mean"] = ratio.detach() * scale
        stats["rlplus/exploration_weight_mean"] = c * scale
        stats["rlplus/prob_mean"] = p * scale
        stats["rlplus/old_prob_mean"] = torch.exp(old.detach()) * scale
        stats["rlplus/demo_token_frac"] = demo.float()
        return LossOutput(per_token, stats)
