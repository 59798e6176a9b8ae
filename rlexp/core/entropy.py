"""Token entropy as a signed, bounded control signal (HAPO, "From Uniform to Heterogeneous: Tailoring Policy
Optimization to Every Token's Nature", Liu et al., 2025; released code starriver030515/HAPO, ``compute_entropy_h``).

Over the valid tokens of a batch, with ℓ = log max(H, ε):

* the pivot p is the ``pivot`` quantile of ℓ (nearest rank; the release's 0.8, i.e. the 80th percentile);
* h = (ℓ − p) / s with s = sqrt(mean((ℓ − p)²)), the root mean square about the pivot;
* ĥ = h / max(h) for h > 0 and h / |min(h)| for h < 0, so ĥ ∈ [−1, 1] on the batch: positive at tokens more
  uncertain than the pivot, negative at the confident ones.

The same statistics (p, s, the two scales) normalise entropies seen later (the sampler's, on the next rollout).

``released_sign``: the released code divides the negative side by min(h) itself (a negative number), which turns
ĥ positive on both sides (|h| scaled to [0, 1]); the paper describes low-entropy tokens as the ones to treat
conservatively (lower temperature, a wider lower clip), which needs the sign kept: that is the default here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EntropyScale:
    """The batch statistics that map a log-entropy to ĥ: pivot, spread, and the scales of each side."""

    pivot: float
    spread: float
    scale_pos: float
    scale_neg: float


def log_entropy(entropy: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return torch.log(entropy.float().clamp(min=eps))


def entropy_scale(
    entropy: torch.Tensor, mask: torch.Tensor, pivot: float = 0.8, eps: float = 1e-6, released_sign: bool = False
) -> EntropyScale:
    """The statistics of the (N, T) token entropies over ``mask``'s valid tokens (see the module docstring)."""
    if not 0.0 <= pivot <= 1.0:
        raise ValueError(f"entropy pivot quantile must be in [0, 1], got {pivot}")
    m = mask.bool()
    ell = log_entropy(entropy, eps)
    valid = ell[m]
    if valid.numel() == 0:
        return EntropyScale(0.0, 1.0, 1.0, -1.0 if released_sign else 1.0)
    p = float(torch.quantile(valid, pivot, interpolation="nearest"))
    h = valid - p
    spread = float(h.pow(2).mean().clamp(min=eps).sqrt())
    h = h / spread
    pos_max = max(float(h.max()), eps)
    neg_min = min(float(h.min()), -eps)
    return EntropyScale(p, spread, 1.0 / pos_max, (1.0 / neg_min) if released_sign else (-1.0 / neg_min))


def normalised_entropy(entropy: torch.Tensor, scale: EntropyScale, eps: float = 1e-6) -> torch.Tensor:
    """ĥ of each entropy under ``scale`` (unclamped: the batch's own tokens lie in [−1, 1])."""
    h = (log_entropy(entropy, eps) - scale.pivot) / scale.spread
    return torch.where(h > 0, h * scale.scale_pos, h * scale.scale_neg)


def entropy_signal(
    entropy: torch.Tensor, mask: torch.Tensor, pivot: float = 0.8, eps: float = 1e-6, released_sign: bool = False
) -> torch.Tensor:
    """ĥ of the (N, T) entropies under their own batch statistics; 0 at invalid positions."""
    scale = entropy_scale(entropy, mask, pivot, eps, released_sign)
    return normalised_entropy(entropy, scale, eps) * mask.bool()
