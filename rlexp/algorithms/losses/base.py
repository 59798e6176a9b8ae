"""What every policy loss returns, and the helpers the loss families share."""

from __future__ import annotations

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


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1)
