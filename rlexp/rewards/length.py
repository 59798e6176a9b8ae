"""Length-penalty reward: shorter correct completions score higher than longer ones of the same group.

The formula is Kimi k1.5's length reward ("Kimi k1.5: Scaling Reinforcement Learning with LLMs",
2025, §2.3.3). For the k completions of one prompt, with ``len_i`` the length of completion i and
``min_len`` / ``max_len`` the shortest and longest in its group::

    λ_i = 0.5 − (len_i − min_len) / (max_len − min_len)
    length_reward_i = λ_i           if completion i is correct
                      min(0, λ_i)   otherwise
    (all 0 when max_len == min_len)

It is added to the correctness reward with a weight (the term's ``weight``). Applied to every group,
this is the unstable baseline of GRPO-λ ("Stable Reinforcement Learning for Efficient Reasoning",
2025): accuracy collapses as the length shrinks. GRPO-λ applies it only to groups with a high
correctness ratio (``rlexp.algorithms.group_stages.length_switch``), using the same function.

Lengths are completion tokens (EOS included, as in ``RolloutBatch.lengths``).
"""

from __future__ import annotations

import torch

from rlexp.core.registry import REWARDS
from rlexp.rewards.terms import Accuracy, RewardTerm, Sample, TermResult


def group_min_max(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (min, max) of ``values`` over each row's group."""
    values = values.float()
    _, inv = torch.unique(group_ids, return_inverse=True)
    k = int(inv.max()) + 1 if inv.numel() else 0
    lo = torch.zeros(k, device=values.device).scatter_reduce(0, inv, values, "amin", include_self=False)
    hi = torch.zeros(k, device=values.device).scatter_reduce(0, inv, values, "amax", include_self=False)
    return lo[inv], hi[inv]


def kimi_length_reward(lengths: torch.Tensor, correct: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(N,) Kimi k1.5 length reward: λ for correct rows, min(0, λ) for the others (see module doc)."""
    lengths = lengths.float()
    lo, hi = group_min_max(lengths, group_ids)
    span = hi - lo
    lam = torch.where(span > 0, 0.5 - (lengths - lo) / span.clamp(min=1e-12), torch.zeros_like(lengths))
    return torch.where(correct.bool(), lam, lam.clamp(max=0.0))


@REWARDS.register
class LengthPenalty(RewardTerm):
    """Kimi k1.5 length reward as a group-aware reward term (``reward=length_penalty``).

    Correctness is scored with the same checker as ``Accuracy`` (``answer_format``,
    ``fallback_last_number``); a completion counts as correct when its accuracy is at least
    ``correct_min`` (1.0: the 0/1 reward of Kimi k1.5). A sample whose correctness check raised is
    scored as incorrect and flagged as a failure of this term.
    """

    def __init__(
        self,
        weight: float = 1.0,
        answer_format: str = "hash",
        fallback_last_number: bool = True,
        correct_min: float = 1.0,
    ):
        super().__init__(weight)
        self.accuracy = Accuracy(1.0, answer_format, fallback_last_number)
        self.correct_min = float(correct_min)

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        acc = self.accuracy(samples)
        correct = torch.tensor([s >= self.correct_min and not f for s, f in zip(acc.scores, acc.failures)])
        lengths = torch.tensor([s.num_tokens for s in samples], dtype=torch.float32)
        groups = torch.tensor([s.group for s in samples])
        scores = kimi_length_reward(lengths, correct, groups)
        return TermResult(scores.tolist(), list(acc.failures))


def cosine_length_reward(
    lengths: torch.Tensor,
    correct: torch.Tensor,
    max_len: int,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
) -> torch.Tensor:
    """(N,) cosine length scaling ("Demystifying Long Chain-of-Thought Reasoning in LLMs", Yeo et al., 2025, App.
    C.1; TRL's ``get_cosine_scaled_reward``): v_min + ½(v_max − v_min)(1 + cos(π·|y| / L_max)); a correct completion
    goes from ``max_value_correct`` at length 0 to ``min_value_correct`` at L_max, a wrong one from
    ``min_value_wrong`` (short: punished most) to ``max_value_wrong``. Lengths past L_max count as L_max."""
    progress = lengths.float().clamp(max=max_len) / max_len
    cosine = torch.cos(progress * torch.pi)
    lo = torch.where(correct, torch.tensor(min_value_correct), torch.tensor(max_value_wrong))
    hi = torch.where(correct, torch.tensor(max_value_correct), torch.tensor(min_value_wrong))
    return lo + 0.5 * (hi - lo) * (1.0 + cosine)


@REWARDS.register
class CosineLength(RewardTerm):
    """Cosine-scaled correctness by length as a reward term (``cosine_length_reward``): correctness from the same
    checker as ``Accuracy``, the length in completion tokens, ``max_len`` the generation limit L_max. It replaces the
    accuracy term (it is a correctness reward): use it alone or with a format term. A sample whose check raised
    scores as wrong and is flagged as a failure."""

    def __init__(
        self,
        max_len: int,
        weight: float = 1.0,
        answer_format: str = "hash",
        fallback_last_number: bool = True,
        min_value_wrong: float = -1.0,
        max_value_wrong: float = -0.5,
        min_value_correct: float = 0.5,
        max_value_correct: float = 1.0,
    ):
        super().__init__(weight)
        if max_len < 1:
            raise ValueError(f"reward term CosineLength.max_len={max_len} must be >= 1")
        self.accuracy = Accuracy(1.0, answer_format, fallback_last_number)
        self.max_len = int(max_len)
        self.values = (min_value_wrong, max_value_wrong, min_value_correct, max_value_correct)

    def __call__(self, samples: list[Sample]) -> TermResult:
        if not samples:
            return TermResult([], [])
        acc = self.accuracy(samples)
        correct = torch.tensor([s >= 1.0 and not f for s, f in zip(acc.scores, acc.failures)])
        lengths = torch.tensor([s.num_tokens for s in samples], dtype=torch.float32)
        scores = cosine_length_reward(lengths, correct, self.max_len, *self.values)
        return TermResult(scores.tolist(), list(acc.failures))
