"""Token trust-region projection in place of the clip: TROLL ("TROLL: Trust Regions improve Reinforcement Learning for
Large Language Models", Becker, Freymuth, Thilges, Otto and Neumann, 2025; arXiv 2510.03817).

For every completion token the current policy's next-token distribution π̃ is projected onto the KL ball around the
old policy's, π = argmin KL(π̂ ‖ π̃) s.t. KL(π̂ ‖ π_old) ≤ ε, whose solution is the geometric interpolation
log π ∝ (log π̃ + η*·log π_old) / (η* + 1), with η* = 0 inside the ball and otherwise the root of KL(π_η ‖ π_old) = ε
(found by bisection; the gradient flows through η* by the implicit function theorem, as the paper's differentiable
projection). The objective is the importance-weighted advantage of the projected policy plus a regression of the
current policy onto the projection:  ℓ_t = −(π(o_t)/π_old(o_t))·A_t + α·KL(π̃ ‖ sg(π)).

The distributions live on a sparse support (the paper's sparsification): the old policy's top-K tokens, cut to the
fewest whose mass reaches 1 − δ, plus the sampled token; the rest of the vocabulary is one bucket holding each
distribution's remaining mass (uniform over the tail, so the KLs and the interpolation are those of the full
vocabulary with a uniform tail). The trainer stores the old top-K beside the old log-probs (``support_k``) and the
forward gathers the current log-probs on the support.
"""

from __future__ import annotations

import torch

from rlexp.algorithms.losses.base import LossOutput, expand_like
from rlexp.core.masks import SUPPORT_OLD, SUPPORT_TOKEN
from rlexp.core.registry import LOSSES

MIN_MASS = 1e-12  # floor of a bucket's mass (a rest bucket the support exhausts)


def sparse_support(
    topk_idx: torch.Tensor,
    topk_logp: torch.Tensor,
    tokens: torch.Tensor,
    token_logp: torch.Tensor,
    delta: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The old policy's support per token: (N, T, K + 1) vocabulary ids (its top-K, then the sampled token), their
    old log-probs with −inf where an entry is left out (past the first entries whose mass reaches 1 − δ, or the
    sampled token again when it is among them), and (N, T) the sampled token's column."""
    sorted_lp, order = topk_logp.sort(-1, descending=True)
    sorted_idx = topk_idx.gather(-1, order)
    probs = sorted_lp.exp()
    keep = torch.cumsum(probs, -1) - probs < 1.0 - delta  # the fewest top entries whose mass reaches 1 − δ
    is_token = sorted_idx == tokens.unsqueeze(-1)
    keep = keep | is_token  # the sampled token always stays
    old = torch.where(keep, sorted_lp, torch.full_like(sorted_lp, float("-inf")))
    has_token = is_token.any(-1)
    token_col = torch.where(has_token, is_token.float().argmax(-1), torch.full_like(tokens, topk_idx.shape[-1]))
    extra_lp = torch.where(has_token, torch.full_like(token_logp, float("-inf")), token_logp)
    idx = torch.cat([sorted_idx, tokens.unsqueeze(-1)], -1)
    old = torch.cat([old, extra_lp.unsqueeze(-1)], -1)
    return idx, old, token_col


def with_rest(support_logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(…, S + 1) log-probs: the support's (−inf where not valid) and the rest bucket's log(1 − Σ p) last."""
    lp = support_logp.masked_fill(~valid, float("-inf"))
    rest = (1.0 - lp.exp().sum(-1)).clamp(min=MIN_MASS).log()
    return torch.cat([lp, rest.unsqueeze(-1)], -1)


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) over the last axis of log-probs; entries where p is −inf add 0."""
    live = torch.isfinite(p)
    diff = torch.where(live, p - q.clamp(min=-1e30), torch.zeros_like(p))
    return (p.exp() * diff).sum(-1)


def interpolate(cur: torch.Tensor, old: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """Normalised (cur + η·old) / (η + 1) in log space; entries that are −inf in both stay −inf."""
    live = torch.isfinite(cur) & torch.isfinite(old)
    c, o = cur.masked_fill(~live, 0.0), old.masked_fill(~live, 0.0)
    e = eta.unsqueeze(-1)
    inner = ((c + e * o) / (e + 1.0)).masked_fill(~live, float("-inf"))
    return inner - torch.logsumexp(inner, -1, keepdim=True)


@torch.no_grad()
def solve_eta(cur: torch.Tensor, old: torch.Tensor, bound: float, steps: int = 30) -> torch.Tensor:
    """η* per token: 0 where KL(cur ‖ old) ≤ bound, else the root of KL(π_η ‖ old) = bound (KL falls as η grows),
    bisected on log η in [−10, 12]."""
    active = kl(cur, old) > bound
    lo = torch.full(cur.shape[:-1], -10.0, dtype=cur.dtype, device=cur.device)
    hi = torch.full_like(lo, 12.0)
    for _ in range(steps):
        mid = (lo + hi) / 2
        over = kl(interpolate(cur, old, mid.exp()), old) > bound
        lo, hi = torch.where(over, mid, lo), torch.where(over, hi, mid)
    return torch.where(active, ((lo + hi) / 2).exp(), torch.zeros_like(lo))


def project(cur: torch.Tensor, old: torch.Tensor, bound: float, steps: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    """The trust-region projection of ``cur`` (log-probs with gradient) around ``old``: its log-probs and η*. Where
    the constraint binds, η carries the implicit gradient dη/dθ = −(∂g/∂θ)/(∂g/∂η) of g = KL(π_η ‖ old) = bound."""
    eta = solve_eta(cur.detach(), old, bound, steps)
    active = eta > 0
    if bool(active.any()):
        with torch.enable_grad():
            e = eta.detach().clone().requires_grad_(True)
            g_eta = torch.autograd.grad(kl(interpolate(cur.detach(), old, e), old).sum(), e)[0]
        g_eta = torch.where(g_eta.abs() > 1e-8, g_eta, torch.full_like(g_eta, -1e-8))
        g = kl(interpolate(cur, old, eta), old)  # ≈ bound where active; its θ-gradient drives η's
        eta = torch.where(active, eta - (g - g.detach()) / g_eta, eta)
    return interpolate(cur, old, eta), eta.detach()


@LOSSES.register
class TrustRegionProjection:
    """TROLL's loss on the sparse support: ℓ_t = −exp(log π(o_t) − log π_old(o_t))·A_t + α·KL(π̃_t ‖ sg(π_t)), π the
    projection of the current π̃ onto KL(· ‖ π_old) ≤ ``kl_bound`` (``project``). No clip. Reads the old support
    (``batch.extras``: its log-probs and the sampled token's column, set by the trainer from the old top-``top_k``
    with mass cut ``delta``) and the current log-probs on it (``support_logprobs``, from the forward). On-policy
    (π̃ = π_old) the projection is the identity and the loss is the policy gradient.

    Stats: ``troll/projected_frac`` (tokens whose constraint binds), ``troll/kl_to_old`` (KL(π̃ ‖ π_old)),
    ``troll/kl_projected`` (KL(π ‖ π_old) ≤ kl_bound), ``troll/eta``, ``troll/support`` (tokens in the support),
    ``troll/regression`` (KL(π̃ ‖ π)), ``ratio/mean``."""

    batch_extras = (SUPPORT_OLD, SUPPORT_TOKEN)

    def __init__(
        self, kl_bound: float = 0.05, alpha: float = 1.0, top_k: int = 64, delta: float = 1e-5, steps: int = 30
    ):
        if kl_bound <= 0 or alpha < 0 or top_k < 1 or not 0 <= delta < 1 or steps < 1:
            raise ValueError(
                f"loss TrustRegionProjection: kl_bound={kl_bound} must be > 0, alpha={alpha} >= 0, top_k={top_k} "
                f">= 1, delta={delta} in [0, 1), steps={steps} >= 1"
            )
        self.kl_bound, self.alpha, self.support_k, self.delta, self.steps = kl_bound, alpha, top_k, delta, steps

    def __call__(
        self, logp, old_logp, advantages, mask, support_old_logprobs=None, support_token_pos=None, support_logprobs=None
    ) -> LossOutput:
        if support_logprobs is None or support_old_logprobs is None or support_token_pos is None:
            raise ValueError("loss TrustRegionProjection needs the old support and the current log-probs on it")
        valid = torch.isfinite(support_old_logprobs)
        old = with_rest(support_old_logprobs.float(), valid)
        cur = with_rest(support_logprobs.float(), valid)
        proj, eta = project(cur, old, self.kl_bound, self.steps)
        pos = support_token_pos.long().unsqueeze(-1)
        proj_token = proj.gather(-1, pos).squeeze(-1)
        ratio = torch.exp(proj_token - old_logp)
        regression = kl(cur, proj.detach())
        per_token = -ratio * expand_like(advantages, logp) + self.alpha * regression
        live = mask.bool()
        per_token = torch.where(live, per_token, torch.zeros_like(per_token))
        stats = {
            "troll/projected_frac": (eta > 0).float(),
            "troll/kl_to_old": kl(cur.detach(), old),
            "troll/kl_projected": kl(proj.detach(), old),
            "troll/eta": eta,
            "troll/support": valid.float().sum(-1),
            "troll/regression": regression.detach(),
            "ratio/mean": ratio.detach(),
        }
        return LossOutput(per_token, {k: torch.where(live, v, torch.zeros_like(v)) for k, v in stats.items()})
