"""A reward term that gives a sample NaN or ±inf stops the step before any update, in one line naming the term and
the sample (issue 16: it surfaced as a "non-finite gradient norm" at step 1, naming nothing)."""

import math

import pytest
import torch

from rlexp.core.batch import RolloutBatch
from rlexp.rewards.scoring import NonFiniteRewardError, score
from rlexp.rewards.terms import RewardTerm, TermResult


def _batch(groups=(0, 0, 1, 1, 2, 2)):
    n = len(groups)
    return RolloutBatch(
        prompt_ids=torch.ones(n, 3, dtype=torch.long),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.full((n, 4), 5, dtype=torch.long),
        completion_mask=torch.ones(n, 4, dtype=torch.long),
        sampling_logprobs=torch.zeros(n, 4),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        prompts=[f"p{g}" for g in groups],
        completions=["c"] * n,
        records=[{"id": f"rec-{g}", "question": f"What is {g} + {g}?", "answer": str(2 * g)} for g in groups],
    )


class Fixed(RewardTerm):
    def __init__(self, scores, weight=1.0):
        super().__init__(weight)
        self.scores = scores

    def __call__(self, samples):
        return TermResult(list(self.scores))


def test_nan_names_the_term_and_the_sample():
    with pytest.raises(NonFiniteRewardError) as e:
        score(_batch(), {"ok": Fixed([1.0] * 6), "judge": Fixed([0, 1, 0, math.nan, math.nan, 1])})
    assert str(e.value) == (
        "reward.terms.judge returned nan for sample 3 (completion 1 of group 1, record 'rec-1', question "
        "'What is 1 + 1?'); 2 of 6 samples are not finite numbers (a reward function may return None for "
        "'does not apply', scored 0)"
    )


@pytest.mark.parametrize("bad", [math.inf, -math.inf, None, "high"])
def test_inf_and_non_numbers_too(bad):
    with pytest.raises(NonFiniteRewardError, match=r"^reward\.terms\.t returned .* for sample 0 \(completion 0"):
        score(_batch(), {"t": Fixed([bad, 0, 0, 0, 0, 0])})


def test_non_finite_weight_names_the_key():
    with pytest.raises(NonFiniteRewardError, match=r"^reward\.terms\.t\.weight=nan: must be a finite number$"):
        score(_batch(), {"t": Fixed([0.0] * 6, weight=math.nan)})


def test_finite_scores_pass():
    b = score(_batch(), {"a": Fixed([0, 1, 0, 1, 0, 1]), "b": Fixed([1] * 6, weight=0.5)})
    assert b.reward.tolist() == [0.5, 1.5, 0.5, 1.5, 0.5, 1.5]


def nan_for_group_one(sample):
    """A reward function (``fn(sample)``) that breaks on the second prompt of a step."""
    return math.nan if sample.group == 1 else 0.0


def test_training_stops_before_the_update_naming_the_term(tiny_cfg, monkeypatch):
    import rlexp.trainer.loop as loop
    from rlexp.runs.training import run

    def no_update(*a, **k):
        raise AssertionError("the policy was updated")

    monkeypatch.setattr(loop, "policy_update", no_update)
    cfg = tiny_cfg(f"+reward.terms.broken._target_={__name__}.nan_for_group_one")
    with pytest.raises(NonFiniteRewardError) as e:
        run(cfg)
    msg = str(e.value)
    assert msg.startswith("reward.terms.broken returned nan for sample 4 (completion 0 of group 1, record '")
    assert "4 of 8 samples are not finite numbers" in msg and "\n" not in msg
