"""A test-only reward that varies between completions of a random-weight model (whose answers are
never correct): the share of letters in the completion that are vowels, in [0, 1]."""

from rlexp.rewards.terms import RewardTerm


class VowelShare(RewardTerm):
    def __init__(self, weight: float = 1.0, **_ignored):
        super().__init__(weight)

    def score(self, sample) -> float:
        letters = [c for c in sample.completion.lower() if c.isalpha()]
        return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


# Overrides that swap the accuracy term for this one (trainer.accuracy_term stays "accuracy").
VARYING = ["reward=accuracy", "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare"]


def vowel_share_or_none(completions, **kwargs):
    """TRL's reward-function convention with "does not apply": None for a completion of odd length (about half of
    a random model's), else the vowel share."""
    out = []
    for c in completions:
        letters = [ch for ch in c.lower() if ch.isalpha()]
        out.append(None if len(c) % 2 else (sum(ch in "aeiou" for ch in letters) / len(letters) if letters else 0.0))
    return out


# The same as a plain function that leaves some rows unscored (batch.extras["unscored"]).
SOMETIMES_NONE = [
    "reward=accuracy",
    "reward.terms.accuracy._target_=tests.algorithms.varying_reward.vowel_share_or_none",
    "~reward.terms.accuracy.answer_format",
    "~reward.terms.accuracy.fallback_last_number",
]
