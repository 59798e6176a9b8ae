"""Search-QA rewards (issue 28): SQuAD normalisation, exact match and token F1 worked out by hand, StepSearch's
answer-last F1, and SSRL's self-search format reward on hand-scored responses."""

from __future__ import annotations

import pytest

from rlexp.rewards.search import (
    AnswerF1,
    SelfSearchFormat,
    ends_with_answer,
    exact_match,
    gold_answers,
    normalize_answer,
    self_search_format,
    token_f1,
)
from rlexp.rewards.terms import Sample


def sample(text: str, record: dict | None = None) -> Sample:
    return Sample("q", text, record or {"answer": "Keldmoor"}, 0, 10, False)


def test_normalisation_exact_match_and_f1_by_hand():
    assert normalize_answer("  The River, Tavel! ") == "river tavel"
    assert gold_answers({"answer": "Tavel", "metadata": {"answers": ["Tavel", "river Tavel"]}}) == [
        "Tavel",
        "river Tavel",
    ]
    assert exact_match("the Tavel.", ["Tavel"]) == 1.0 and exact_match("Tavel river", ["Tavel"]) == 0.0
    assert exact_match(None, ["Tavel"]) == 0.0
    # "orla venn born" vs "orla venn": 2 common tokens, precision 2/3, recall 1 -> F1 = 2·(2/3)/(5/3) = 0.8
    assert token_f1("Orla Venn born", ["Orla Venn"]) == pytest.approx(0.8)
    # the best gold: "keldmoor" vs "keldmoor river" -> p 1, r 1/2 -> 2/3; vs "orla" -> 0
    assert token_f1("Keldmoor", ["Orla", "Keldmoor river"]) == pytest.approx(2 / 3)
    assert token_f1("the", ["the"]) == 0.0  # both normalise to nothing: no common token


def test_answer_f1_scores_only_a_response_that_ends_with_its_answer():
    term = AnswerF1(answer_format="tag", unanswered=-1.0)
    record = {"answer": "Keldmoor", "metadata": {"answers": ["Keldmoor"]}}
    assert term.score(sample("<answer>Keldmoor</answer>", record)) == 1.0
    assert term.score(sample("<answer>Keldmoor town</answer>\n", record)) == pytest.approx(2 / 3)
    assert term.score(sample("<answer>Keldmoor</answer> I think.", record)) == -1.0  # text after the answer
    assert term.score(sample("Keldmoor", record)) == -1.0
    assert AnswerF1(answer_format="tag").score(sample("no answer", record)) == 0.0
    assert ends_with_answer("#### 12", "hash") and not ends_with_answer("12", "hash")


THINK_ANSWER = "<think>I know it.</think><answer>1873</answer>"
FULL = "<think>Need a fact.</think><search>Orla born</search><information>Born 1873.</information><think>So.</think>"


@pytest.mark.parametrize(
    "text, score",
    [
        (THINK_ANSWER, 0.5),  # 1 think: min(1/2, 1) · (1 = 0 searches + 1) -> 0.5
        (FULL + "<answer>1873</answer>", 1.0),  # 2 thinks, 1 search: min(2/2, 1) · 1
        # 1 think, 1 search: 1/2 · min(1, 2) / max(1, 2) = 0.25
        ("<think>a</think><search>q</search><information>i</information><answer>x</answer>", 0.25),
        # 3 thinks, 1 search: min(3/2, 1) · 2/3
        (FULL + "<think>Check.</think><answer>1873</answer>", pytest.approx(2 / 3)),
        (" " + FULL + "<answer>1873</answer>\n", 1.0),  # surrounding white space is stripped
        ("<think>a</think><search></search><information>i</information><answer>x</answer>", 0.0),  # empty search
        ("<think>a</think><search>q\nr</search><information>i</information><answer>x</answer>", 0.0),  # 2 lines
        ("<think>a</think><search>your query</search><information>i</information><answer>x</answer>", 0.0),
        ("<think>a</think><search>q</search><answer>x</answer>", 0.0),  # a search without its information
        ("<think>a</think><b>bold</b><answer>x</answer>", 0.0),  # another tag
        ("Sure. " + THINK_ANSWER, 0.0),  # does not start with <think>
        (THINK_ANSWER + " Done.", 0.0),  # does not end with </answer>
        ("<answer>x</answer><think>a</think><answer>x</answer>", 0.0),  # does not open with a think block
        ("<think>a</think>" * 9 + "<answer>x</answer>", 0.0),  # more than 8 think blocks
    ],
)
def test_self_search_format_as_the_release_scores_it(text, score):
    assert self_search_format(text) == score
    assert SelfSearchFormat().score(sample(text)) == score


def test_self_search_format_settings():
    assert self_search_format(THINK_ANSWER, max_turn=1) == 1.0
    with pytest.raises(ValueError, match="SelfSearchFormat: max_turn and max_think must be >= 1"):
        SelfSearchFormat(max_turn=0)
