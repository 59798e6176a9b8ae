"""The PPO critic ("Proximal Policy Optimization Algorithms", 2017; for LMs as in "Training language
models to follow instructions with human feedback", 2022): a value model V(prefix) trained on the
GAE returns with a clipped value loss and its own optimiser (its own learning rate).

* The value model is a copy of the policy's transformer trunk (``policy.base_model``) with a scalar
  head (zero-initialised, so V starts at 0) — a separate network, as in verl and OpenRLHF; it is
  built lazily from the policy the first time the critic's stage runs.
* ``stage(batch, ctx)`` fills ``batch.values`` (N, T): V of the prefix before each completion token.
  ``Algorithm`` appends it after the configured group stages.
* ``update(batch, ...)`` runs μ passes of the clipped value loss
  ½·max((V − R)², (V_old + clip(V − V_old, ±c) − R)²), token-mean over the loss mask of the whole
  batch (the same global normaliser whatever the micro-batching), R = ``batch.extras["returns"]``
  (written by the ``gae`` estimator). Gradient-norm clipping at ``max_grad_norm``.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch
from torch import nn

from rlexp.core.forward import padded_causal_mask, sequence_inputs
from rlexp.core.masks import loss_mask
from rlexp.core.micro_batches import plan_micro_batches
from rlexp.core.registry import CRITICS


class ValueModel(nn.Module):
    def __init__(self, policy: nn.Module):
        super().__init__()
        self.trunk = copy.deepcopy(policy.base_model)
        self.trunk.requires_grad_(True)
        p = next(self.trunk.parameters())
        self.head = nn.Linear(policy.config.hidden_size, 1, device=p.device, dtype=p.dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, prompt_ids, prompt_mask, completion_ids, completion_mask, autocast_dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """(N, T) values; column t is V of the prefix that precedes completion token t."""
        input_ids, attention, positions = sequence_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
        T = completion_ids.shape[1]
        with torch.autocast(
            input_ids.device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
        ):
            hidden = self.trunk(
                input_ids=input_ids,
                attention_mask=padded_causal_mask(attention),
                position_ids=positions,
                use_cache=False,
            ).last_hidden_state[:, -(T + 1) : -1]
            values = self.head(hidden).squeeze(-1)
        return values.float()


@CRITICS.register
class Critic:
    """PPO critic settings and state. ``lr``: the critic's AdamW learning rate (verl's default 1e-5,
    10× the actor's); ``value_clip``: c of the clipped value loss (verl: 0.5; ``None`` = unclipped);
    ``finished_only``: update only on rows that finished (T-PPO; logs ``critic/rows``, skips a step with none)."""

    def __init__(
        self,
        lr: float = 1e-5,
        value_clip: float | None = 0.5,
        max_grad_norm: float | None = 1.0,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        finished_only: bool = False,
    ):
        if lr <= 0:
            raise ValueError(f"algorithm.critic.lr={lr} must be > 0")
        if value_clip is not None and value_clip <= 0:
            raise ValueError(f"algorithm.critic.value_clip={value_clip} must be > 0 or null")
        self.lr, self.value_clip, self.max_grad_norm = lr, value_clip, max_grad_norm
        self.weight_decay, self.betas = weight_decay, tuple(betas)
        # T-PPO: the value model learns only from finished rows (no truncated ones): their returns are complete
        self.finished_only = bool(finished_only)
        self.model: ValueModel | None = None
        self.optimizer = None

    def build(self, policy: nn.Module) -> None:
        self.model = ValueModel(policy).train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.lr, betas=self.betas, weight_decay=self.weight_decay, fused=True
        )

    @torch.no_grad()
    def values(
        self, batch, micro_batch: int, autocast_dtype: torch.dtype | None = None, micro_batch_tokens: int | None = None
    ) -> torch.Tensor:
        out = torch.zeros(batch.completion_mask.shape, dtype=torch.float32, device=batch.completion_mask.device)
        for mb in plan_micro_batches(batch, micro_batch, share_prompts=False, max_tokens=micro_batch_tokens):
            p, pm, c, cm, end = mb.rows(batch)
            out[mb.dev_idx, :end] = self.model(p, pm, c, cm, autocast_dtype) * cm
        return out

    def stage(self, batch, ctx):
        """Group stage: ``batch.values`` from the current critic (built from ``ctx.policy`` at first use)."""
        if self.model is None:
            self.build(ctx.policy)
        settings = getattr(ctx, "settings", None)
        micro = getattr(settings, "micro_batch_size", 0) or 0
        owner = getattr(getattr(ctx, "sample", None), "__self__", None)
        batch.values = self.values(
            batch, micro, getattr(owner, "autocast_dtype", None), getattr(settings, "micro_batch_tokens", None)
        )
        return batch

    def value_loss(self, values, old_values, returns, mask, total_tokens: float):
        """Per-micro-batch share of the clipped value loss, and its clip indicator per token."""
        l1 = (values - returns) ** 2
        if self.value_clip is None:
            per, clipped = l1, torch.zeros_like(l1, dtype=torch.bool)
        else:
            v_clip = old_values + (values - old_values).clamp(-self.value_clip, self.value_clip)
            l2 = (v_clip - returns) ** 2
            per, clipped = torch.max(l1, l2), l2 > l1
        m = mask.to(per.dtype)
        return 0.5 * (per * m).sum() / max(total_tokens, 1.0), clipped

    def update(
        self,
        batch,
        *,
        mu: int,
        micro_batch: int,
        autocast_dtype: torch.dtype | None = None,
        micro_batch_tokens: int | None = None,
        dist=None,
    ) -> dict[str, float]:
        """μ passes of the value loss over ``batch``. ``dist`` (distributed=ddp: the trainer's process group, with
        ``sum_floats`` and ``all_reduce_grads``): every process's rows are one batch, as on a single process: the
        token normaliser and the metrics are global and the gradients summed over the processes before each step."""
        if self.model is None:
            raise RuntimeError("critic.update before critic.stage: the critic has no values for this batch")
        if "returns" not in batch.extras or batch.values is None:
            raise ValueError("critic.update needs batch.values and batch.extras['returns'] (advantage: gae)")
        total_of = (lambda xs: dist.sum_floats(xs)) if dist is not None else (lambda xs: xs)
        sums: dict[str, float] = defaultdict(float)
        if self.finished_only:  # T-PPO: train on the finished rows alone (truncated rows are left out of the pass)
            keep = (~batch.truncated.bool()).nonzero().squeeze(-1).cpu()
            sums["critic/rows"] = total_of([float(keep.numel())])[0]
            if sums["critic/rows"] == 0:  # nothing finished this step (on any process): no value update
                sums["critic/lr"] = self.optimizer.param_groups[0]["lr"]
                return dict(sums)
            if keep.numel() < len(batch):
                batch = batch.select(keep)
        mask = loss_mask(batch)
        returns, old_values = batch.extras["returns"].float(), batch.values.float()
        total = total_of([float(mask.sum())])[0]
        loss_sum, clipped_sum = 0.0, 0.0
        for _ in range(mu):
            self.optimizer.zero_grad(set_to_none=True)
            plans = plan_micro_batches(batch, micro_batch, share_prompts=False, max_tokens=micro_batch_tokens)
            for mb in plans if len(batch) else []:  # a process whose rows all fell out still joins the reduction
                dev_idx = mb.dev_idx
                p, pm, c, cm, end = mb.rows(batch)
                v = self.model(p, pm, c, cm, autocast_dtype)
                lm = mask[dev_idx, :end]
                loss, clipped = self.value_loss(v, old_values[dev_idx, :end], returns[dev_idx, :end], lm, total)
                loss.backward()
                loss_sum += float(loss.detach())
                clipped_sum += float((clipped.float() * lm).sum())
            if dist is not None:
                dist.all_reduce_grads(self.model)
            params = [q for q in self.model.parameters() if q.grad is not None]
            gn = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or float("inf"))
            self.optimizer.step()
            sums["critic/grad_norm"] += float(gn) / mu
        m = mask.bool()
        r, v = returns[m].double(), old_values[m].double()
        d = r - v
        n, sr, srr, sv, sd, sdd, loss_sum, clipped_sum = total_of(
            [float(r.numel()), float(r.sum()), float(r @ r), float(v.sum()), float(d.sum()), float(d @ d), loss_sum,
             clipped_sum]
        )  # fmt: skip
        sums["critic/value_loss"] = loss_sum / mu
        sums["critic/value_clip_frac"] = clipped_sum / max(total, 1.0) / mu
        if n > 0:
            sums["critic/values_mean"] = sv / n
            sums["critic/returns_mean"] = sr / n
            var_r = (srr - sr * sr / n) / (n - 1) if n > 1 else 0.0  # unbiased, as torch.var
            var_d = (sdd - sd * sd / n) / (n - 1) if n > 1 else 0.0
            sums["critic/explained_var"] = 1 - var_d / var_r if var_r > 0 else 0.0
        sums["critic/lr"] = self.optimizer.param_groups[0]["lr"]
        return dict(sums)

    def state_dict(self) -> dict | None:
        if self.model is None:
            return None
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict | None, policy: nn.Module) -> None:
        if state is None:
            return
        if self.model is None:
            self.build(policy)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
