"""SPAM — "SPAM: Spike-Aware Adam with Momentum Reset for Stable LLM Training" (Huang et al., 2025; arXiv 2501.06842).

Adam with two additions, as the authors' released optimiser (TianjinYellow/SPAM-Optimizer, ``galore_torch/SPAM.py``)
applies them:

* **momentum reset**: every ``reset_interval`` ΔT optimiser steps (the step t with (t + 1) mod ΔT = 0, t counted
  from 0) both moments are set to zero before the step's gradient enters them; the bias-correction step count keeps
  running. After each reset the update is scaled by a cosine warm-up, 1 − 0.99·(1 + cos(π·s / (W + 1))) / 2 for the
  s = 0 … W − 1 steps since the reset (W = ``warmup_steps``), 1 afterwards.
* **spike-aware clipping**: a gradient entry with g² > θ·v (θ = ``threshold``, v the second moment before this
  step) is set to sign(g)·√(θ·v); it acts from step ``grad_accu_steps`` on, and — with resets — only once
  ``grad_accu_steps`` steps have passed since the last reset (the moments have re-accumulated).

Weight decay as the released code: p ← p − lr·λ·p after the Adam step. The released code's optional sparse
momentum (``density`` < 1, random masks) is not here: every entry keeps its moments.
"""

from __future__ import annotations

import math

import torch

from rlexp.core.registry import OPTIMIZERS


def warmup_scale(steps_since_reset: int, warmup_steps: int) -> float:
    """The update's scale ``steps_since_reset`` steps after a momentum reset (1 before any reset)."""
    if steps_since_reset >= warmup_steps:
        return 1.0
    return 1.0 - 0.99 * (1.0 + math.cos(math.pi * steps_since_reset / (warmup_steps + 1))) / 2.0


@OPTIMIZERS.register
class SPAM(torch.optim.Optimizer):
    """Adam with momentum reset every ΔT steps, a cosine warm-up after it, and spike-aware gradient clipping."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        reset_interval: int = 500,
        warmup_steps: int = 150,
        threshold: float = 5000.0,
        grad_accu_steps: int = 20,
    ):
        if lr <= 0:
            raise ValueError(f"optimizer.lr must be > 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"optimizer.betas must be in [0, 1), got {list(betas)}")
        if reset_interval < 0 or warmup_steps < 0 or grad_accu_steps < 0 or threshold < 0:
            raise ValueError(
                "optimizer: reset_interval, warmup_steps, grad_accu_steps and threshold must be >= 0 "
                f"(got {reset_interval}, {warmup_steps}, {grad_accu_steps}, {threshold})"
            )
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.reset_interval, self.warmup_steps = int(reset_interval), int(warmup_steps)
        self.threshold, self.grad_accu_steps = float(threshold), int(grad_accu_steps)
        # the optimiser's own counters live in the first group, so torch's state_dict carries them into checkpoints
        self.param_groups[0].setdefault("spam_total_step", 0)
        self.param_groups[0].setdefault("spam_since_reset", None)  # None: no reset yet (no warm-up)
        self.last_metrics: dict[str, float] = {}

    @property
    def total_step(self) -> int:
        return int(self.param_groups[0]["spam_total_step"])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        head = self.param_groups[0]
        t = int(head["spam_total_step"])  # 0-based index of this step
        since = head["spam_since_reset"]
        scale = 1.0 if since is None else warmup_scale(int(since), self.warmup_steps)
        reset = self.reset_interval > 0 and (t + 1) % self.reset_interval == 0
        clip = self.threshold > 0 and (t + 1) >= self.grad_accu_steps
        if clip and self.reset_interval > 0:
            clip = (t + 1) % self.reset_interval >= self.grad_accu_steps
        spikes = 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("SPAM does not support sparse gradients")
                # moments in at least fp32 (a bf16 parameter keeps fp32 moments)
                grad = p.grad.to(torch.promote_types(p.grad.dtype, torch.float32), copy=True)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                if reset:
                    state["exp_avg"].zero_()
                    state["exp_avg_sq"].zero_()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                if clip:
                    bound = v * self.threshold
                    spike = grad.square() > bound
                    spikes += int(spike.sum())
                    grad = torch.where(spike, grad.sign() * bound.sqrt(), grad)
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                n = state["step"]
                step_size = group["lr"] * math.sqrt(1.0 - beta2**n) / (1.0 - beta1**n)
                update = m / (v.sqrt() + group["eps"])
                p.add_(update.to(p.dtype), alpha=-step_size * scale)
                if group["weight_decay"] > 0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        head["spam_total_step"] = t + 1
        if reset:
            head["spam_since_reset"] = 0
        elif since is not None:
            head["spam_since_reset"] = int(since) + 1
        # the step's metrics (the trainer averages an optimiser's ``last_metrics`` over the step's optimiser steps)
        self.last_metrics = {
            "optimizer/spike_entries": float(spikes),
            "optimizer/momentum_reset": float(reset),
            "optimizer/update_scale": scale,
        }
        return loss
