"""Online Merging Optimizers — "Online Merging Optimizers for Boosting Rewards and Mitigating Tax in Alignment"
(Lu, Yu, Huang, Fan, Lin, Zhou, 2024; arXiv 2405.17931).

At every step the optimiser's own update δ (Adam's, as in the released ``ODAdamW`` / ``OTAdamW`` of
QwenLM/online_merging_optimizers) is merged with τ = θ_SFT − θ_base, the parameter delta between the SFT model (the
policy's initial weights) and the pretrained model it was tuned from, so the RL update is steered toward the SFT
direction:

* **OnDARE** (``mode=ondare``): τ is drop-and-rescaled once, at construction (each entry kept with probability p,
  the reserve rate, and divided by p; then clamped to ±``clip``); at each step δ is drop-and-rescaled with a fresh
  random mask (optionally L1-rescaled back to its sum of magnitudes, ``rescale``) and the parameters move by
  α·τ + (1 − α)·δ̃ (α the merge weight).
* **OnTIES** (``mode=onties``): τ keeps its top-p share of entries by magnitude (per tensor), once; at each step δ
  is trimmed the same way, the sign of each entry is elected as sign(τ + δ̃) (≥ 0: +), the entries of τ and δ̃ whose
  sign disagrees are zeroed, and the parameters move by α·τ̂ + (1 − α)·δ̂.

Weight decay as the released code (p ← p − lr·λ·p after the step). The released code's k-step online merging
(``online_step`` > 1) is not carried: the merge acts at every step.

τ is one extra copy of the trainable parameters, kept outside the optimiser state (it is rebuilt from the SFT and
base weights when the optimiser is built, before a resumed run loads its checkpoint, so checkpoints do not grow).
The base model is named by a model config (``optimizer.base_model``, as ``conf/model/<name>.yaml``); it is loaded
once, paired with the policy's trainable parameters in order (same architecture: every shape must match) and freed.

Metrics (``last_metrics``): ``online_merging/update_cos_to_delta`` (cosine of the applied update with τ, over all
parameters), ``online_merging/raw_cos_to_delta`` (the same for Adam's update before the merge: the gap is the
steering), ``online_merging/kept_frac`` (share of update entries the sparsification and sign election kept).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from rlexp.core.registry import OPTIMIZERS

MODES = ("ondare", "onties")


def dare_mask(shape, reserve: float, generator: torch.Generator, device) -> torch.Tensor:
    """Bool mask keeping each entry with probability ``reserve`` (DARE's random drop)."""
    return torch.rand(shape, generator=generator, device=device) < reserve


def magnitude_mask(x: torch.Tensor, density: float) -> torch.Tensor:
    """Bool mask of the ⌊density·n⌋ entries of ``x`` largest in magnitude (TIES's trim); all kept when density ≥ 1
    or the count rounds to 0 (as the released ``magnitude_mask_``)."""
    k = int(density * x.numel())
    if density >= 1 or k < 1:
        return torch.ones_like(x, dtype=torch.bool)
    idx = torch.topk(x.reshape(-1).abs(), k, sorted=False).indices
    mask = torch.zeros(x.numel(), dtype=torch.bool, device=x.device)
    mask[idx] = True
    return mask.view_as(x)


def dare(x: torch.Tensor, keep: torch.Tensor, reserve: float, rescale: bool, clip: float | None) -> torch.Tensor:
    """DARE on ``x`` with the drawn mask ``keep``: kept entries divided by ``reserve``, dropped ones 0. ``rescale``:
    then scaled so the sum of magnitudes is the original's (and clamped to ±``clip``)."""
    out = torch.where(keep, x / reserve, torch.zeros_like(x))
    if rescale:
        before = x.abs().sum()
        if before >= 1e-8:
            out = out * (before / (out.abs().sum() + 1e-8))
            if clip is not None:
                out = out.clamp(-clip, clip)
    return out


def trim(x: torch.Tensor, density: float, rescale: bool) -> torch.Tensor:
    """TIES's trim: the top-``density`` entries of ``x`` by magnitude kept, the rest 0 (``rescale``: to the
    original sum of magnitudes)."""
    out = x * magnitude_mask(x, density)
    if rescale:
        before = x.abs().sum()
        if before >= 1e-8:
            out = out * (before / out.abs().sum())
    return out


def ondare_merge(update: torch.Tensor, tau: torch.Tensor, alpha: float) -> torch.Tensor:
    """OnDARE's step: α·τ + (1 − α)·δ̃ (``update`` already drop-and-rescaled, ``tau`` the dropped SFT delta)."""
    return alpha * tau + (1.0 - alpha) * update


def onties_merge(update: torch.Tensor, tau: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """OnTIES's step: the elected sign sign(τ + δ̃) (≥ 0: +), entries of each disagreeing with it zeroed, then
    α·τ̂ + (1 − α)·δ̂ (``update`` and ``tau`` already trimmed). Also the bool mask of the update's entries kept."""
    elected = torch.where(tau + update >= 0, 1.0, -1.0).to(update.dtype)
    tau_hat = tau * (torch.sign(tau) == elected)
    kept = torch.sign(update) == elected  # a zero (trimmed) entry never matches ±1
    return alpha * tau_hat + (1.0 - alpha) * update * kept, kept


def _model_config(cfg):
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return cfg
    if isinstance(cfg, Mapping):
        return OmegaConf.create(dict(cfg))
    raise ValueError(
        f"optimizer.base_model must be a model config (as conf/model/<name>.yaml), got {type(cfg).__name__}"
    )


@OPTIMIZERS.register
class OnlineMerging(torch.optim.Optimizer):
    """Adam whose every update is merged with the SFT − base parameter delta (OnDARE / OnTIES)."""

    def __init__(
        self,
        params,
        base_model=None,
        mode: str = "ondare",
        lr: float = 1e-6,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        reserve: float = 0.01,
        alpha: float = 1e-7,
        rescale: bool = False,
        clip: float = 1.0,
        seed: int = 0,
        base_params: list[torch.Tensor] | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"optimizer.mode={mode!r} is not one of {list(MODES)}")
        if lr <= 0:
            raise ValueError(f"optimizer.lr must be > 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"optimizer.betas must be in [0, 1), got {list(betas)}")
        if not 0.0 < reserve <= 1.0:
            raise ValueError(f"optimizer.reserve (the kept share p) must be in (0, 1], got {reserve}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"optimizer.alpha (the merge weight) must be in [0, 1], got {alpha}")
        if clip <= 0:
            raise ValueError(f"optimizer.clip must be > 0, got {clip}")
        params = list(params)
        if params and isinstance(params[0], dict):
            raise ValueError("optimizer=online_merging takes a plain list of parameters (one group)")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.mode, self.reserve, self.alpha = mode, float(reserve), float(alpha)
        self.rescale, self.clip = bool(rescale), float(clip)
        device = params[0].device if params else torch.device("cpu")
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        if base_params is None:
            if base_model is None:
                raise ValueError(
                    "optimizer.base_model is not set: online merging needs the pretrained model the policy was "
                    "fine-tuned from, as a model config (e.g. optimizer.base_model={source: hub, name: SmolLM2-135M, "
                    "path: HuggingFaceTB/SmolLM2-135M, dtype: auto})"
                )
            from rlexp.models.loading import load_model

            base = load_model(_model_config(base_model), device).model
            base_params = [p.detach() for p in base.parameters()]
            del base
        self.tau: dict[torch.Tensor, torch.Tensor] = self._build_tau(params, list(base_params))
        self.last_metrics: dict[str, float] = {}

    @torch.no_grad()
    def _build_tau(self, params: list[torch.Tensor], base: list[torch.Tensor]) -> dict:
        if len(base) != len(params):
            raise ValueError(
                f"optimizer.base_model has {len(base)} parameter tensors, the policy {len(params)} trainable ones: "
                "online merging pairs them in order, so it needs the same architecture and every parameter trainable "
                "(not model/peft=lora)"
            )
        tau = {}
        for i, (p, b) in enumerate(zip(params, base)):
            if p.shape != b.shape:
                raise ValueError(
                    f"optimizer.base_model: parameter {i} has shape {tuple(b.shape)}, the policy's {tuple(p.shape)} "
                    "(the base must share the policy's architecture)"
                )
            delta = p.detach().float() - b.to(p.device).float()
            if self.mode == "ondare":
                keep = dare_mask(delta.shape, self.reserve, self.generator, delta.device)
                t = dare(delta, keep, self.reserve, False, None).clamp_(-self.clip, self.clip)
            else:
                t = trim(delta, self.reserve, self.rescale)
            tau[p] = t.to(p.dtype)
        return tau

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sums = []  # per parameter: (update·τ, raw·τ, |update|², |raw|², |τ|², kept entries), summed on the device
        total = 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("online merging does not support sparse gradients")
                grad = p.grad.to(torch.promote_types(p.grad.dtype, torch.float32))
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                n = state["step"]
                step_size = group["lr"] * math.sqrt(1.0 - beta2**n) / (1.0 - beta1**n)
                raw = -step_size * m / (v.sqrt() + group["eps"])  # Adam's update δ
                tau = self.tau[p].to(raw.dtype)
                if self.mode == "ondare":
                    kept = dare_mask(raw.shape, self.reserve, self.generator, raw.device)
                    update = ondare_merge(dare(raw, kept, self.reserve, self.rescale, self.clip), tau, self.alpha)
                else:
                    update, kept = onties_merge(trim(raw, self.reserve, self.rescale), tau, self.alpha)
                p.add_(update.to(p.dtype))
                if group["weight_decay"] > 0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
                sums.append(
                    torch.stack(
                        [
                            (update * tau).sum(),
                            (raw * tau).sum(),
                            update.square().sum(),
                            raw.square().sum(),
                            tau.square().sum(),
                            kept.sum().to(raw.dtype),
                        ]
                    ).double()
                )
                total += update.numel()
        du, dr, uu, rr, tt, kept_n = torch.stack(sums).sum(0).tolist() if sums else [0.0] * 6  # one host sync

        def cos(dot: float, a: float) -> float:
            return dot / math.sqrt(a * tt) if a > 0 and tt > 0 else 0.0

        self.last_metrics = {
            "online_merging/update_cos_to_delta": cos(du, uu),
            "online_merging/raw_cos_to_delta": cos(dr, rr),
            "online_merging/kept_frac": kept_n / total if total else 0.0,
        }
        return loss
