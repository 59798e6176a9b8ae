"""TTRL's majority-vote reward (rlexp.rewards.label_free): the group's most frequent answer is the pseudo-label."""

import pytest

from rlexp.rewards.label_free import MajorityVote, majority_answer
from rlexp.rewards.terms import Sample


def _s(text, group, answer="999"):
    return Sample("q", text, {"answer": answer, "scorer": "exact", "id": "r"}, group, 5, False)


def test_majority_answer_by_equivalence_ties_to_the_first():
    assert majority_answer(["4", "4.0", "5", None]) == "4"  # 4 and 4.0 are one answer
    assert majority_answer(["5", "4"]) == "5"  # a tie: the first seen
    assert majority_answer([None, None]) is None


def test_scores_agreement_with_the_group_majority_not_the_ground_truth():
    term = MajorityVote(answer_format="hash", fallback_last_number=False)
    samples = [_s("#### 4", 0), _s("#### 4", 0), _s("#### 5", 0), _s("no answer", 0), _s("#### 7", 1)]
    res = term(samples)
    # group 0's majority is 4 (the gold 999 is never read); group 1's single answer is its own majority
    assert res.scores == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_min_share_withholds_a_weak_pseudo_label():
    term = MajorityVote(answer_format="hash", fallback_last_number=False, min_share=0.6)
    samples = [_s("#### 4", 0), _s("#### 4", 0), _s("#### 5", 0), _s("#### 6", 0)]  # 4 holds 2 of 4 < 0.6
    assert term(samples).scores == [0.0] * 4
    with pytest.raises(ValueError, match="min_share"):
        MajorityVote(min_share=2.0)


def test_a_copied_answer_placeholder_is_no_answer_and_never_wins_a_vote():
    """SmolLM2 under Co-Reward learned to end with the prompt's own '#### <answer>': a consensus of copies."""
    from rlexp.algorithms.group_stages.votes import cross_vote_rewards
    from rlexp.rewards.answers import extract_answer

    assert extract_answer("61 + 73 = 124.\n#### <answer>", "hash") is None
    assert extract_answer("61 + 73 = 124.\n#### <answer>", "hash", fallback_last_number=True) == "124"
    assert extract_answer("<answer>answer</answer>", "tag") is None
    copies = [extract_answer(t, "hash") for t in ["#### <answer>", "#### <Answer>", "#### 5", "#### <answer>"]]
    assert copies == [None, None, "5", None]
    scores, labels = cross_vote_rewards(copies, [0, 0, 1, 1])
    assert labels == {0: "5", 1: None} and scores == [0.0, 0.0, 0.0, 0.0]
