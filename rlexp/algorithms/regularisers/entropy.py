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

import math

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


@REGULARISERS.register
class EntropySmoothing:
    """EPO's entropy term ("EPO: Entropy-regularized Policy Optimization for LLM Agents Reinforcement Learning", Xu et
    al., 2025; arXiv 2509.22576, Eqs. 2–6 and Algorithm 1): an entropy bonus over the episode's policy tokens, all turns
    together, plus a smoothing penalty that keeps each token's entropy in a corridor around the historical average.

    Per token: ``coef`` λ · (−H + β_k · α · P(H)), P(H) = [κ_l·H̄_W − H]₊ + [H − κ_r·H̄_W]₊, where H̄_W is the mean of
    the earlier training steps' token-mean entropies (the paper's cumulative window W_k; the token mean of this term's
    own entropies, ``epo/entropy``, appended after each step) and β_k = 1 + exp(−γ·k / k_mid), k the 0-based step and
    k_mid = ⌊K/2⌋ (K = ``total_steps``; the paper's dynamic weight, 2 at the start, → 1 by mid-training). At step 0
    there is no history and the penalty is off (Algorithm 1). Differentiable through H (the full-vocabulary entropy):
    the penalty's gradient pushes a token's entropy back up under the corridor and down above it.

    Per-token statistics: ``epo/entropy`` (H), ``epo/smoothing_penalty`` (α·P: its token mean is L_smooth),
    ``epo/out_of_band_frac`` (tokens outside the corridor). After each step: ``epo/entropy_target`` (H̄_W used at the
    step, 0 before any history), ``epo/beta`` (β_k used; 0 while the penalty is off), ``epo/next_entropy_target``."""

    clamp = 0.0

    def __init__(
        self,
        coef: float = 0.001,
        alpha: float = 0.1,
        kappa_low: float = 0.0,
        kappa_high: float = 2.0,
        gamma: float = 3.0,
        total_steps: int = 100,
        dynamic_weight: bool = True,
    ):
        if coef < 0 or alpha < 0:
            raise ValueError(f"algorithm.entropy_control: coef ({coef}) and alpha ({alpha}) must be >= 0")
        if not 0.0 <= kappa_low <= kappa_high:
            raise ValueError(
                f"algorithm.entropy_control: need 0 <= kappa_low ({kappa_low}) <= kappa_high ({kappa_high})"
            )
        if gamma < 0:
            raise ValueError(f"algorithm.entropy_control.gamma={gamma} must be >= 0")
        if total_steps < 1:
            raise ValueError(f"algorithm.entropy_control.total_steps={total_steps} must be >= 1")
        self.coef, self.alpha, self.gamma = float(coef), float(alpha), float(gamma)
        self.kappa_low, self.kappa_high = float(kappa_low), float(kappa_high)
        self.total_steps, self.dynamic_weight = int(total_steps), bool(dynamic_weight)
        self.history: list[float] = []  # H̄_m of each earlier step m

    @property
    def step_index(self) -> int:
        """k: the 0-based index of the step being trained (the steps already in the history)."""
        return len(self.history)

    def target(self) -> float | None:
        """H̄_W: the mean of the earlier steps' entropies (None before the first step ends)."""
        return sum(self.history) / len(self.history) if self.history else None

    def beta(self) -> float:
        """β_k = 1 + exp(−γ·k / k_mid), k_mid = ⌊K/2⌋ (1 with ``dynamic_weight=false``: the paper's "W/O DW")."""
        if not self.dynamic_weight:
            return 1.0
        k_mid = max(1, self.total_steps // 2)
        return 1.0 + math.exp(-self.gamma * self.step_index / k_mid)

    def penalty(self, entropy: torch.Tensor, target: float) -> torch.Tensor:
        """P(H) = [κ_l·H̄ − H]₊ + [H − κ_r·H̄]₊ per token (differentiable through H)."""
        h = entropy.float()
        return torch.relu(self.kappa_low * target - h) + torch.relu(h - self.kappa_high * target)

    def token_term(self, entropy: torch.Tensor, mask: torch.Tensor, selected: torch.Tensor | None = None):
        """(N, T) λ·(−H + β_k·α·P(H)) to add to the per-token loss, and its per-token statistics."""
        h = entropy.float()
        target = self.target()
        if target is None:
            smooth = torch.zeros_like(h)
            out = torch.zeros_like(h, dtype=torch.bool)
        else:
            smooth = self.alpha * self.penalty(h, target)
            out = smooth.detach() > 0
        beta = self.beta() if target is not None else 0.0
        stats = {"epo/entropy": h.detach(), "epo/smoothing_penalty": smooth.detach()}
        stats["epo/out_of_band_frac"] = out.float()
        return self.coef * (-h + beta * smooth), stats

    def update(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Append the step's token-mean entropy H̄_k to the history (the next step's corridor is around the new mean)."""
        target, beta = self.target(), self.beta()
        h = metrics.get("epo/entropy", float("nan"))
        if math.isfinite(h):
            self.history.append(float(h))
        nxt = self.target()
        return {
            "epo/entropy_target": target if target is not None else 0.0,
            "epo/beta": beta if target is not None else 0.0,
            "epo/next_entropy_target": nxt if nxt is not None else 0.0,
        }

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.history = [float(x) for x in state["history"]]
