"""A frozen, pretrained value model in place of a co-trained critic: DVPO's global value model ("Pretrain Value, Not
Reward: Decoupled Value Policy Optimization", first titled "Lean and Mean: Decoupled Value Policy Optimization with
Global Value Guidance", Huang et al., 2025, arXiv 2502.16944; released code microsoft/DKI_LLM ``dvpo/``:
``value_model_training/vas_trainer.py`` and ``policy_model_training/policyv1_trainer.py``).

* The value model is :class:`rlexp.algorithms.critics.ppo.ValueModel` (a copy of the policy's trunk + a scalar head):
  column t of its output is V of the prefix before completion token t, the GVM's token-level return-to-go.
* Offline phase (:func:`fit_value_model`): the GVM is fitted on logged policy trajectories with their outcome rewards,
  as the released ``VASTrainer.step``: the reward is paid at the last token, the targets are λ-returns
  (:func:`lambda_returns`: GAE on the model's own values before the batch's passes, γ = 1, λ = 0.95 released), the
  loss ½·(V − R)² token-mean (no value clip), ``epochs`` passes per batch (released ``vas_epochs`` = 2). Saved with
  :func:`save_value_model`, a ``torch.save`` of the ValueModel's state dict (trunk + head: the trunk must have the
  policy's architecture).
* Policy phase (:class:`FrozenValueCritic`): the critic's ``stage`` fills ``batch.values`` from the frozen model
  (``path``: the saved GVM); ``update`` changes nothing (no optimiser exists) and logs that the weights did not move.
  ``whiten_values`` standardises the values over the batch's valid completion tokens, as the released policy trainer
  whitens the GVM's output (released: over the whole padded forward tensor, prompt positions included: ours the
  completion tokens). The advantage is ``gae`` with ``outcome_reward: false``: r_t = −β·KL_t, the values carry the
  reward signal (the released trainer pays no score, only the KL penalty).
* ``path: null``: a scaled-down stand-in for the offline phase — the value model is fitted once, on the first rollout
  batch it sees (the initial policy's trajectories and their outcome rewards; ``fit_epochs`` passes at ``fit_lr``),
  then frozen for the rest of training. The checkpoint keeps the fitted weights (``state_dict``), so a resumed run does
  not refit.

Metrics (prefix ``metric_prefix``, ``dvpo``): ``<p>/value_mean`` and ``<p>/value_std`` (the frozen model's raw values
over valid tokens, before whitening), ``<p>/fitted`` (1 on the step the stand-in fit ran), ``<p>/fit_loss`` (its last
pass's value loss), ``<p>/weight_change`` (|Σ params now − Σ params when frozen|: 0 when the model stays frozen).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from rlexp.algorithms.critics.ppo import Critic, ValueModel
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import KL_PENALTY, loss_mask
from rlexp.core.micro_batches import plan_micro_batches
from rlexp.core.registry import CRITICS
from rlexp.core.stats import masked_whiten


def lambda_returns(
    values: torch.Tensor, outcome: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> torch.Tensor:
    """(N, T) λ-returns R_t = A_t + V_t of GAE with the ``outcome`` (N,) paid at each row's last valid token and no
    other reward: δ_t = r_t + γV_{t+1} − V_t (V = 0 after the last token), A_t = Σ_k (γλ)^k δ_{t+k}; a masked position
    passes V and A through; 0 on padding. λ = 1, γ = 1: R_t = outcome at every token (the Monte-Carlo return)."""
    m = mask.float()
    v = values.float() * m
    n, width = m.shape
    rewards = torch.zeros_like(v)
    has = m.sum(-1) > 0
    last = (m.sum(-1) - 1).clamp(min=0).long()
    rows = torch.arange(n, device=v.device)[has]
    rewards[rows, last[has]] = outcome.float().to(v.device)[has]
    adv = torch.zeros_like(v)
    next_value = torch.zeros(n, device=v.device)
    running = torch.zeros(n, device=v.device)
    for t in reversed(range(width)):
        mt = m[:, t]
        delta = rewards[:, t] + gamma * next_value - v[:, t]
        running = (delta + gamma * lam * running) * mt + running * (1 - mt)
        next_value = v[:, t] * mt + next_value * (1 - mt)
        adv[:, t] = running * mt
    return (adv + v) * m


def fit_value_model(
    model: ValueModel,
    batches: Iterable[RolloutBatch],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1.41e-5,
    epochs: int = 2,
    gamma: float = 1.0,
    lam: float = 0.95,
    max_grad_norm: float | None = None,
    micro_batch: int = 0,
    autocast_dtype: torch.dtype | None = None,
    micro_batch_tokens: int | None = None,
) -> dict[str, float]:
    """DVPO's offline GVM training (module doc) on scored rollout batches (``batch.reward``: the outcome): for each
    batch, λ-returns from the model's values before its passes, then ``epochs`` passes of ½·(V − R)² (token mean over
    the batch's loss mask), one optimiser step per pass. ``optimizer``: an existing one (else AdamW at ``lr``).
    Returns ``value_loss`` (the last pass's), ``batches`` and ``passes``."""
    if epochs < 1:
        raise ValueError(f"fit_value_model: epochs={epochs} must be >= 1")
    if lr <= 0:
        raise ValueError(f"fit_value_model: lr={lr} must be > 0")
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    stats = {"value_loss": 0.0, "batches": 0.0, "passes": 0.0}
    was_training = model.training
    model.train()
    for batch in batches:
        if batch.reward is None:
            raise ValueError("fit_value_model needs scored batches (batch.reward: the outcome of each row)")
        mask = loss_mask(batch).float()
        total = float(mask.sum())
        with torch.no_grad():
            values = torch.zeros(mask.shape, device=mask.device)
            for mb in plan_micro_batches(batch, micro_batch, share_prompts=False, max_tokens=micro_batch_tokens):
                p, pm, c, cm, end = mb.rows(batch)
                values[mb.dev_idx, :end] = model(p, pm, c, cm, autocast_dtype) * cm
        outcome = batch.reward.float()
        penalty = batch.extras.get(KL_PENALTY)  # kl.mode=reward: the outcome before the trainer's KL charge
        if penalty is not None:
            outcome = outcome + (penalty.float() * batch.completion_mask.float()).sum(-1)
        returns = lambda_returns(values, outcome, batch.completion_mask, gamma, lam)
        for _ in range(epochs):
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for mb in plan_micro_batches(batch, micro_batch, share_prompts=False, max_tokens=micro_batch_tokens):
                p, pm, c, cm, end = mb.rows(batch)
                v = model(p, pm, c, cm, autocast_dtype)
                lm = mask[mb.dev_idx, :end]
                loss = 0.5 * (((v - returns[mb.dev_idx, :end]) ** 2) * lm).sum() / max(total, 1.0)
                loss.backward()
                loss_sum += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
            optimizer.step()
            stats["value_loss"] = loss_sum
            stats["passes"] += 1
        stats["batches"] += 1
    model.train(was_training)
    return stats


def save_value_model(model: ValueModel, path: str | Path) -> None:
    """Save a fitted GVM (the ValueModel's state dict: trunk + head) for ``FrozenValueCritic(path=...)``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)


def _checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


@CRITICS.register
class FrozenValueCritic(Critic):
    """A value model that is never updated (DVPO's GVM; module doc). ``path``: a GVM saved by
    :func:`save_value_model` (null: fit one on the first rollout batch, then freeze). ``whiten_values``: standardise
    the values over each batch's valid tokens. ``fit_lr``, ``fit_epochs``, ``fit_lam``: the stand-in fit (path null)."""

    def __init__(
        self,
        path: str | None = None,
        whiten_values: bool = True,
        fit_lr: float = 1.0e-4,
        fit_epochs: int = 4,
        fit_gamma: float = 1.0,
        fit_lam: float = 0.95,
        metric_prefix: str = "dvpo",
        eps: float = 1e-8,
    ):
        where = "algorithm.critic (FrozenValueCritic)"
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{where}.path={path!r} is not a file (a GVM saved by save_value_model)")
        if fit_lr <= 0:
            raise ValueError(f"{where}.fit_lr={fit_lr} must be > 0")
        if not isinstance(fit_epochs, int) or fit_epochs < 1:
            raise ValueError(f"{where}.fit_epochs={fit_epochs!r} must be an integer >= 1")
        if not 0.0 <= fit_gamma <= 1.0 or not 0.0 <= fit_lam <= 1.0:
            raise ValueError(f"{where}.fit_gamma={fit_gamma} and fit_lam={fit_lam} must be in [0, 1]")
        self.path, self.whiten_values = path, bool(whiten_values)
        self.fit_lr, self.fit_epochs, self.fit_gamma, self.fit_lam = float(fit_lr), fit_epochs, fit_gamma, fit_lam
        self.prefix, self.eps = metric_prefix, eps
        self.model: ValueModel | None = None
        self.optimizer = None
        self.fitted = False
        self._sum: float | None = None

    def build(self, policy: nn.Module) -> None:
        self.model = ValueModel(policy)
        if self.path is not None:
            state = torch.load(self.path, map_location=next(self.model.parameters()).device, weights_only=True)
            self.model.load_state_dict(state)
            self._freeze()

    def _freeze(self) -> None:
        self.model.requires_grad_(False)
        self.model.eval()
        self.fitted = True
        self._sum = _checksum(self.model)

    def stage(self, batch, ctx):
        """Group stage: ``batch.values`` from the frozen value model (fitted on this batch first when ``path`` is
        null and nothing is fitted yet)."""
        if self.model is None:
            self.build(ctx.policy)
        settings = getattr(ctx, "settings", None)
        micro = getattr(settings, "micro_batch_size", 0) or 0
        tokens = getattr(settings, "micro_batch_tokens", None)
        owner = getattr(getattr(ctx, "sample", None), "__self__", None)
        dtype = getattr(owner, "autocast_dtype", None)
        p = self.prefix
        if not self.fitted:
            fit = fit_value_model(
                self.model,
                [batch],
                lr=self.fit_lr,
                epochs=self.fit_epochs,
                gamma=self.fit_gamma,
                lam=self.fit_lam,
                micro_batch=micro,
                autocast_dtype=dtype,
                micro_batch_tokens=tokens,
            )
            self._freeze()
            batch.stats[f"{p}/fitted"] = 1.0
            batch.stats[f"{p}/fit_loss"] = fit["value_loss"]
        else:
            batch.stats[f"{p}/fitted"] = 0.0
        values = self.values(batch, micro, dtype, tokens)
        mask = batch.completion_mask.float()
        valid = values[mask.bool()]
        batch.stats[f"{p}/value_mean"] = float(valid.mean()) if valid.numel() else 0.0
        batch.stats[f"{p}/value_std"] = float(valid.std(unbiased=False)) if valid.numel() else 0.0
        if self.whiten_values:
            values = masked_whiten(values, mask, self.eps) * mask
        batch.values = values
        return batch

    def update(self, batch, **_ignored) -> dict[str, float]:
        """No update: the value model is frozen. Reports how far its weights moved since they were frozen (0)."""
        if self.model is None:
            raise RuntimeError("critic.update before critic.stage: the frozen value model was never built")
        change = abs(_checksum(self.model) - self._sum) if self._sum is not None else math.nan
        return {f"{self.prefix}/weight_change": change}

    def state_dict(self) -> dict | None:
        if self.model is None or not self.fitted:
            return None
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state: dict | None, policy: nn.Module) -> None:
        if state is None:
            return
        if self.model is None:
            self.model = ValueModel(policy)
        self.model.load_state_dict(state["model"])
        self._freeze()
