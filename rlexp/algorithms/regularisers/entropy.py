"""High-entropy token selection ("Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", 2025): the policy gradient is kept only on the top-ρ
fraction of tokens by entropy (the paper: ρ = 0.2, the "forking" tokens); the other tokens' policy
loss is multiplied by 0 while they still count in the aggregation's token/row normalisers (TRL's
``top_entropy_quantile``).

The threshold is the (1 − ρ) quantile (linear interpolation, ``torch.quantile``) of the entropies of
the valid tokens of the micro-batch being differentiated — TRL's scope on one process (it gathers
across processes; verl's recipe also works per micro-batch). Tokens with entropy ≥ threshold are kept.
"""

from __future__ import annotations

import torch

from rlexp.core.forward import clamped_entropy  # noqa: F401  (AEnt's entropy, computed in the forward)
from rlexp.core.registry import REGULARISERS


@REGULARISERS.register
def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """(N, T) bool: valid tokens whose entropy is ≥ the (1 − ``top_quantile``) quantile."""
    if not 0.0 < top_quantile <= 1.0:
        raise ValueError(f"algorithm.top_entropy_quantile={top_quantile} must be in (0, 1]")
    valid = mask.bool()
    if not valid.any():
        return torch.zeros_like(valid)
    if top_quantile >= 1.0:
        return valid
    threshold = torch.quantile(entropy.detach()[valid].float(), 1.0 - top_quantile)
    return (entropy.detach() >= threshold) & valid


CONTROLS = ("fixed", "band", "target")


@REGULARISERS.register
class EntropyBonus:
    """An entropy bonus −c·H per token with a coefficient controller (``algorithm.entropy_control``).

    ``clamp`` p > 0: H is AEnt's clamped entropy (``clamped_entropy``), else the full-vocabulary entropy. The
    coefficient c moves once per training step, from that step's token-mean H̄ of the bonus's entropy:

    * ``fixed``: never (a plain bonus of weight ``coef``).
    * ``band`` (AEnt, arXiv 2509.03493; the AReaL port's ``recipe/AEnt``): after ``warmup_steps`` steps,
      c ← clip(c − lr·[min(0, H̄ − low) + max(0, H̄ − high)], coef_min, coef_max): c grows while H̄ is under the
      band, shrinks while above it, stays inside it.
    * ``target`` (TRL's ``use_adaptive_entropy``, Skywork-OR1's controller): c ← min(c + lr, coef_max) when
      H̄ ≤ ``target``, else max(c − lr, coef_min); the bonus acts only while the last measured H̄ ≤ target.
    """

    def __init__(
        self,
        coef: float = 0.001,
        clamp: float = 0.0,
        control: str = "fixed",
        low: float = 0.1,
        high: float = 0.5,
        target: float = 0.2,
        lr: float = 0.001,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
        warmup_steps: int = 0,
    ):
        if control not in CONTROLS:
            raise ValueError(f"algorithm.entropy_control.control={control!r} is not one of {list(CONTROLS)}")
        if not 0.0 <= clamp < 1.0:
            raise ValueError(f"algorithm.entropy_control.clamp={clamp} must be in [0, 1)")
        if not 0.0 <= coef_min <= coef_max:
            raise ValueError(f"algorithm.entropy_control: need 0 <= coef_min ({coef_min}) <= coef_max ({coef_max})")
        if control == "band" and low > high:
            raise ValueError(f"algorithm.entropy_control: the band's low ({low}) is above its high ({high})")
        if lr < 0 or warmup_steps < 0:
            raise ValueError(f"algorithm.entropy_control: lr ({lr}) and warmup_steps ({warmup_steps}) must be >= 0")
        self.coef, self.clamp, self.control = float(coef), float(clamp), control
        self.low, self.high, self.target, self.lr = float(low), float(high), float(target), float(lr)
        self.coef_min, self.coef_max, self.warmup_steps = float(coef_min), float(coef_max), int(warmup_steps)
        self.active = True  # target control: whether the last measured entropy was at or below the target

    def coefficient(self) -> float:
        """The coefficient the loss uses now."""
        return self.coef if self.active else 0.0

    def token_term(self, entropy: torch.Tensor, mask: torch.Tensor, selected: torch.Tensor | None = None):
        """(N, T) −c·H to add to the per-token loss, and its per-token statistics."""
        stats = {"entropy_bonus/entropy": entropy.detach()}
        coef = self.coefficient()
        return (-coef * entropy if coef else torch.zeros_like(entropy)), stats

    def update(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Move the coefficient after training step ``step`` from its token-mean bonus entropy H̄."""
        mean_entropy = metrics.get("entropy_bonus/entropy", float("nan"))
        used = self.coefficient()
        if self.control == "band" and step > self.warmup_steps:
            grad = min(0.0, mean_entropy - self.low) + max(0.0, mean_entropy - self.high)
            self.coef = min(max(self.coef - self.lr * grad, self.coef_min), self.coef_max)
        elif self.control == "target":
            below = mean_entropy <= self.target
            step_c = self.lr if below else -self.lr
            self.coef = min(max(self.coef + step_c, self.coef_min), self.coef_max)
            self.active = below
        return {"entropy_bonus/coef": used, "entropy_bonus/next_coef": self.coefficient()}

    def state_dict(self) -> dict:
        return {"coef": self.coef, "active": self.active}

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:  # None: a checkpoint from before the bonus kept state — the configured start
            self.coef, self.active = float(state["coef"]), bool(state["active"])


@REGULARISERS.register
class EntropyBand:
    """SPINE's entropy band on the forking tokens ("SPINE: Token-Selective Test-Time Reinforcement Learning with
    Entropy-Band Regularization", 2025; arXiv 2511.17938): for each completion, over its forking tokens (those the
    high-entropy selection keeps, ``algorithm.top_entropy_quantile``), the band is [q_low, q_high], the ``low`` and
    ``high`` quantiles of their entropies (no gradient); each forking token adds
    λ·(max(0, H − q_high) + max(0, q_low − H)) to its loss — entropy pushed up under the band, down above it.
    Without a selection every valid token counts as forking. Differentiable through H (full-vocabulary entropy)."""

    clamp = 0.0

    def __init__(self, coef: float = 0.01, low: float = 0.1, high: float = 0.5):
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"algorithm.entropy_control: need 0 <= low ({low}) <= high ({high}) <= 1 (quantiles)")
        if coef < 0:
            raise ValueError(f"algorithm.entropy_control.coef={coef} must be >= 0")
        self.coef, self.low, self.high = float(coef), float(low), float(high)

    def token_term(self, entropy: torch.Tensor, mask: torch.Tensor, selected: torch.Tensor | None = None):
        forking = mask.bool() if selected is None else selected.bool() & mask.bool()
        h = entropy.float()
        masked = h.detach().masked_fill(~forking, float("nan"))
        q = torch.nanquantile(masked, torch.tensor([self.low, self.high], device=h.device), dim=-1)  # (2, N)
        q_low, q_high = q[0].nan_to_num(0.0)[:, None], q[1].nan_to_num(0.0)[:, None]
        above, below = torch.relu(h - q_high), torch.relu(q_low - h)
        f = forking.float()
        stats = {"entropy_band/above": (above.detach() > 0).float() * f, "entropy_band/below": (below.detach() > 0) * f}
        return self.coef * (above + below) * f, stats

    def update(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Nothing adapts (the band is per completion, from its own entropies); no state for checkpoints."""
        return {}
