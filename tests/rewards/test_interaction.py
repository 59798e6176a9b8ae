"""CoMAS's interaction rewards (rlexp/rewards/interaction.py), by hand: the score read from a scoring reply (valid,
malformed, missing, out of range) and the (solution, evaluation, scoring) rewards it gives."""

from __future__ import annotations

import pytest

from rlexp.rewards.interaction import (
    MALFORMED,
    MISSING,
    OUT_OF_RANGE,
    PARSED,
    check_scale,
    interaction_rewards,
    normalised_score,
    parse_interaction_score,
)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("The review's point is fatal.\n<score>1</score>", (1, PARSED)),
        ("< Score > 3 </ SCORE >", (3, PARSED)),  # spaces and case inside the tags
        ("<score>2</score> no wait <score>3</score>", (3, PARSED)),  # the last tag is the verdict
        ("Minor slips only: score 2.", (None, MISSING)),  # no tag
        ("", (None, MISSING)),
        (None, (None, MISSING)),
        ("<score>two</score>", (None, MALFORMED)),
        ("<score>2.5</score>", (None, MALFORMED)),  # an integer score only
        ("<score></score>", (None, MALFORMED)),
        ("<score>2", (None, MISSING)),  # an unclosed tag (a reply cut at the token limit)
        ("<score>4</score>", (None, OUT_OF_RANGE)),
        ("<score>0</score>", (None, OUT_OF_RANGE)),
        ("<score>-1</score>", (None, OUT_OF_RANGE)),
    ],
)
def test_the_score_is_the_last_tag_an_integer_in_range(reply, expected):
    assert parse_interaction_score(reply) == expected


def test_another_scale_and_pattern():
    assert parse_interaction_score("Score: 7", r"score:\s*(\S+)", (1, 10)) == (7, PARSED)
    assert parse_interaction_score("<score>5</score>", scale=(1, 5)) == (5, PARSED)
    # 1–10: (7 − 1) / 9 = 2/3
    assert normalised_score(7, (1, 10)) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "score, expected",
    [
        (3, (1.0, 0.0, 0.0)),  # (3 − 1)/2 = 1: the solution wins, the critique that failed to sink it gets 0
        (2, (0.5, 0.5, 0.0)),  # (2 − 1)/2 = 1/2 each
        (1, (0.0, 1.0, 0.0)),  # the critique sank the solution: the evaluator takes all
        (None, (0.0, 0.0, -1.0)),  # no score: the scorer's format penalty, nothing for the other two
    ],
)
def test_the_rewards_are_zero_sum_between_solution_and_evaluation(score, expected):
    sol, ev, sc = interaction_rewards(score)
    assert (sol, ev, sc) == pytest.approx(expected)
    if score is not None:
        assert sol + ev == pytest.approx(1.0)


def test_the_failure_rewards_are_a_setting():
    assert interaction_rewards(None, failure=(0.0, 0.0, -0.5)) == (0.0, 0.0, -0.5)
    # 1–5: s = 4 -> n = 3/4, evaluation 1/4
    assert interaction_rewards(4, scale=(1, 5)) == pytest.approx((0.75, 0.25, 0.0))


@pytest.mark.parametrize("scale", [(3, 1), (2, 2), (1.5, 3), ("a", 3), (1,)])
def test_a_bad_scale_names_the_key(scale):
    with pytest.raises(ValueError, match="scale"):
        check_scale(scale)
