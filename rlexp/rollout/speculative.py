"""SPEC-RL's speculative rollouts ("SPEC-RL: Accelerating On-Policy Reinforcement Learning via Speculative
Rollouts", Liu et al., 2025, arXiv 2509.23232; released code github.com/ShopeeLLM/Spec-RL).

The completions a prompt got the last time it was sampled are drafts: row j of the prompt's group is drafted by
row j of its previous group. The current policy scores every draft in one forward over prompt + draft; draft
token i is accepted with probability min(1, ℓ · π_new(y_i) / π_old(y_i)) — π_old the log-prob recorded when the
draft was sampled, ℓ the lenience (the released scripts' ``--bias`` is log ℓ) — and the accepted prefix is the
draft up to the first rejection. A fully accepted draft is reused whole (no decoding); otherwise the current
policy continues from the first rejected position.

Exactness. Speculative sampling draws exactly from π_new when a rejected position is redrawn from the residual
norm(max(0, π_new − π_old)), which needs π_old's whole distribution there; the old weights are gone and only the
sampled token's log-prob is cached (as in the released code), so — as there — the rejected position is sampled
afresh from π_new. Each drafted position's token is then distributed as a + (1 − Σa) · π_new with
a = min(π_old, ℓ · π_new): exactly π_new where the two policies agree, tilted toward the draft where they differ,
more so for ℓ > 1 (``tests/rollout/test_speculative.py`` checks this, and the residual form's exactness, by hand
on a small vocabulary). The reused tokens' sampling log-probs are π_new's, from the verification forward (the
ratio's denominator), and these are what the cache keeps for the next draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SpeculativeReuse:
    """``rollout.speculative_reuse``: ``enabled``; ``lenience`` ℓ > 0 (1: the plain rule; SPEC-RL's runs: e^0.5);
    ``verify_micro_batch``: completions per verification forward (0: all at once; rounded to whole groups)."""

    enabled: bool = False
    lenience: float = 1.0
    verify_micro_batch: int = 0

    def __post_init__(self):
        if not self.lenience > 0:
            raise ValueError(f"rollout.speculative_reuse.lenience must be > 0, got {self.lenience}")
        if self.verify_micro_batch < 0:
            raise ValueError(
                f"rollout.speculative_reuse.verify_micro_batch must be >= 0, got {self.verify_micro_batch}"
            )


def accepted_lengths(
    old_logprobs: torch.Tensor,
    new_logprobs: torch.Tensor,
    mask: torch.Tensor,
    lenience: float = 1.0,
    uniform: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) length of each draft's accepted prefix: draft token i is accepted iff u_i ≤ ℓ · π_new / π_old
    (so with probability min(1, ℓ · π_new / π_old)); the prefix ends at the first rejected token, or is the
    whole draft (``mask``'s length). ``uniform``: the (N, T) draws u (else drawn here)."""
    if uniform is None:
        uniform = torch.rand(mask.shape, device=mask.device)
    valid = mask.bool()
    log_ratio = (new_logprobs - old_logprobs).float() + math.log(lenience)
    reject = valid & (uniform.clamp_min(1e-30).log() > log_ratio)
    return torch.where(reject.any(-1), reject.int().argmax(-1), valid.sum(-1))


class RolloutCache:
    """The last completions of every prompt sampled: prompt text → one (token ids, sampling log-probs) pair of
    1-D tensors per completion (up to and including its EOS), in the group's order. Kept on the CPU; saved in
    checkpoints (``state_dict``), so a resumed run drafts from the same rollouts as an uninterrupted one."""

    def __init__(self):
        self.entries: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, prompt: str, group_size: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The prompt's drafts when it last had a group of ``group_size`` completions, else None."""
        rows = self.entries.get(prompt)
        return rows if rows is not None and len(rows) == group_size else None

    def put(self, prompt: str, ids: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor) -> None:
        """Keep a group's (G, T) completions, each cut to its mask."""
        n = mask.sum(-1).tolist()
        self.entries[prompt] = [
            (ids[j, : n[j]].detach().cpu().clone(), logprobs[j, : n[j]].detach().float().cpu().clone())
            for j in range(ids.shape[0])
        ]

    def state_dict(self) -> dict:
        return {"entries": self.entries}

    def load_state_dict(self, state: dict) -> None:
        self.entries = dict(state["entries"])
