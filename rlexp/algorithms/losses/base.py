"""What every policy loss returns, and the helpers the loss families share."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    per_token: torch.Tensor  # (N, T) loss per token, before aggregation
    token_stats: dict[str, torch.Tensor] = field(default_factory=dict)  # (N, T) values to average over the mask


def expand_like(adv: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def ratio_stats(ratio: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> dict[str, torch.Tensor]:
    low, high = low.float(), high.float()
    return {
        "clip/low_frac": low,
        "clip/high_frac": high,
        "clip/region_frac": torch.clamp(low + high, max=1),
        "ratio/mean": ratio.detach(),
    }


def clamp_log_ratio(log_ratio: torch.Tensor, clamp: float | None) -> torch.Tensor:
    """verl's stability clamp of the log-ratio to [−c, c] (``algorithm.loss.log_ratio_clamp``; verl: 20 in PPO,
    SAPO, CISPO and DPPO); None: none (TRL). Past it the ratio is constant and has no gradient."""
    if clamp is None:
        return log_ratio
    if clamp <= 0:
        raise ValueError(f"algorithm.loss.log_ratio_clamp must be > 0 or null, got {clamp}")
    return log_ratio.clamp(-clamp, clamp)


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1)


def uses_batch_extras(*keys: str) -> Callable:
    """Mark a loss that reads per-row batch fields a stage or estimator put in ``batch.extras`` (GBPO's target
    signal): the trainer hands it each micro-batch's rows of ``batch.extras[key]`` as the keyword ``key``."""

    def mark(fn: Callable) -> Callable:
        fn.batch_extras = tuple(keys)
        return fn

    return mark


def _function(loss: Callable) -> Callable:
    while isinstance(loss, functools.partial):
        loss = loss.func
    return loss


def loss_batch_extras(loss: Callable) -> tuple[str, ...]:
    """The ``batch.extras`` keys a (partial) loss reads (``uses_batch_extras``); () for most losses."""
    fn = _function(loss)
    return tuple(getattr(fn, "batch_extras", None) or getattr(type(fn), "batch_extras", ()) or ())


def loss_takes_entropy(loss: Callable) -> bool:
    """A loss with a parameter named ``entropy`` gets the (N, T) token entropies (no gradient) of the
    micro-batch (ASPO's entropy-dependent clip ranges)."""
    try:
        return "entropy" in inspect.signature(loss).parameters
    except (TypeError, ValueError):
        return False
