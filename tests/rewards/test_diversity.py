"""MultiRole-R1's lexical-diversity reward (arXiv 2507.20187; our definition): 1 − mean n-gram Jaccard overlap with
the other completions of the group."""

import pytest

from rlexp.rewards.diversity import LexicalDiversity, group_diversity, jaccard, ngram_set
from rlexp.rewards.terms import Sample


def _samples(texts, groups):
    return [Sample("p", t, {}, g, len(t.split()), False) for t, g in zip(texts, groups)]


def test_identical_and_disjoint_completions():
    term = LexicalDiversity(n=2)
    same = term(_samples(["the cat sat", "the cat sat", "the cat sat"], [0, 0, 0]))
    assert same.scores == [0.0, 0.0, 0.0]
    apart = term(_samples(["red blue", "green yellow", "one two"], [0, 0, 0]))
    assert apart.scores == [1.0, 1.0, 1.0]


def test_partial_overlap_by_hand():
    # "a b" -> {a, b, (a b)}; "a c" -> {a, c, (a c)}: intersection {a}, union 5 -> Jaccard 1/5
    assert ngram_set(["a", "b"], 2) == {("a",), ("b",), ("a", "b")}
    assert jaccard(ngram_set(["a", "b"], 2), ngram_set(["a", "c"], 2)) == pytest.approx(0.2)
    # a third completion "x y" shares nothing: d("a b") = 1 − (0.2 + 0)/2 = 0.9, same for "a c"; d("x y") = 1
    res = LexicalDiversity(n=2)(_samples(["A b", "a c", "x y", "solo"], [0, 0, 0, 1]))
    assert res.scores == pytest.approx([0.9, 0.9, 1.0, 0.0])  # lower-cased; a group of one scores 0
    assert group_diversity([set(), set()]) == [0.0, 0.0]  # two empty completions are identical


def test_token_unit_and_bad_settings():
    s = [Sample("p", "x", {}, 0, 2, False, [1, 2]), Sample("p", "y", {}, 0, 2, False, [1, 2])]
    assert LexicalDiversity(unit="tokens")(s).scores == [0.0, 0.0]  # same ids, different text
    assert LexicalDiversity(unit="words")(s).scores == [1.0, 1.0]
    with pytest.raises(ValueError, match="unit"):
        LexicalDiversity(unit="chars")
    with pytest.raises(ValueError, match="n="):
        LexicalDiversity(n=0)


@pytest.mark.long  # a two-step run: the long suite (the default suite's 10-minute budget)
def test_diversity_reward_trains_two_steps(tiny_cfg):
    from rlexp.runs.training import run

    cfg = tiny_cfg(
        "reward=diversity",
        "reward.terms.accuracy._target_=tests.algorithms.varying_reward.VowelShare",
        "trainer.autocast=off",
        "trainer.max_new_tokens=6",
        "trainer.num_generations=4",
    )
    m = run(cfg).metrics
    # the tiny random model writes different tokens in each completion: diversity well above 0
    assert 0.0 < m["reward/diversity/mean"] <= 1.0 and m["advantage/abs_mean"] > 0
