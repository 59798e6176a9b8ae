"""Train–inference mismatch corrections: importance weights w = π_train/π_sampler between the policy the
trainer differentiates (its log-probs before the update, ``batch.old_logprobs``) and the engine that sampled
(``batch.sampling_logprobs``: a bf16 generation copy, vLLM), applied to the per-token loss.

As "Stabilizing Reinforcement Learning with LLMs: Formulation and Practices" (2025) argues, the token-level
surrogate is a first-order approximation of the sequence objective only when that discrepancy is small, and
an importance-sampling correction is what keeps on-policy training stable. The modes are the peers' (verl's
rollout correction, TRL's ``vllm_importance_sampling_mode``):

* ``token_truncate``    w_t = min(r_t, C)                          (truncated IS, TIS)
* ``token_mask``        w_t = r_t if r_t ≤ C else 0                (masked IS, MIS)
* ``sequence_truncate`` w = min(Π_t r_t, C) for every token of the sequence
* ``sequence_mask``     w = Π_t r_t if ≤ C else 0
* ``sequence_reject``   w = 1, or 0 for a sequence whose geometric-mean ratio leaves [1/C, C] (rejection
                         of the whole sample; no reweighting)

The weights carry no gradient.
"""

from __future__ import annotations

import torch

from rlexp.config.schema import CORRECTION_MODES as MODES  # one list, also checked at config time
from rlexp.core.registry import REGULARISERS


@REGULARISERS.register
class RolloutCorrection:
    """``correction(train_logp, sampler_logp, mask) -> (weights (N, T), stats)``; ``threshold`` is C."""

    def __init__(self, mode: str = "token_truncate", threshold: float = 2.0):
        if mode not in MODES:
            raise ValueError(f"algorithm.rollout_correction.mode={mode!r} is not one of {list(MODES)}")
        if threshold <= 0 or (mode == "sequence_reject" and threshold <= 1):
            raise ValueError(f"algorithm.rollout_correction.threshold={threshold} must be > 0 (> 1 for rejection)")
        self.mode, self.threshold = mode, float(threshold)

    def __call__(
        self, train_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        m = mask.bool()
        log_r = (train_logp.detach().float() - sampler_logp.float()).masked_fill(~m, 0.0)
        c = self.threshold
        if self.mode.startswith("token"):
            r = torch.exp(log_r)
            cut = r > c
            w = r.clamp(max=c) if self.mode == "token_truncate" else torch.where(cut, torch.zeros_like(r), r)
            affected = cut & m
        else:
            seq = log_r.sum(-1)
            if self.mode == "sequence_reject":
                n = m.sum(-1).clamp(min=1)
                geo = seq / n
                bad = (geo.abs() > torch.log(torch.tensor(c))) & m.any(-1)
                w_seq = (~bad).float()
            else:
                r_seq = torch.exp(seq)
                bad = r_seq > c
                w_seq = r_seq.clamp(max=c) if self.mode == "sequence_truncate" else torch.where(bad, 0.0, r_seq)
            w = w_seq[:, None].expand_as(log_r)
            affected = bad[:, None].expand_as(m) & m
        w = w * m
        n_tok = max(int(m.sum()), 1)
        stats = {
            "rollout_correction/affected_frac": float(affected.sum()) / n_tok,
            "rollout_correction/weight_mean": float(w.sum()) / n_tok,
        }
        return w, stats
