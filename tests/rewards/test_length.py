"""Kimi k1.5 length reward (rlexp.rewards.length), values computed by hand."""

import math

import pytest
import torch
from hydra.utils import instantiate

from rlexp.rewards.length import LengthPenalty, kimi_length_reward
from rlexp.rewards.terms import Sample


def test_kimi_length_reward_on_a_hand_made_group():
    # group 3: lengths 10..40, span 30; lambda = 0.5 - (len - 10)/30 = [0.5, 1/6, -1/6, -0.5]
    # group 8: equal lengths -> 0 for everyone, correct or not
    lengths = torch.tensor([10, 20, 30, 40, 7, 7])
    correct = torch.tensor([False, True, True, False, True, False])
    groups = torch.tensor([3, 3, 3, 3, 8, 8])
    got = kimi_length_reward(lengths, correct, groups)
    # incorrect rows get min(0, lambda): the short wrong one gets 0, not +0.5
    expected = [0.0, 1 / 6, -1 / 6, -0.5, 0.0, 0.0]
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


def test_kimi_length_reward_groups_by_id_not_position():
    # the same two groups interleaved: each row is compared with its own group only
    lengths = torch.tensor([10, 100, 30, 300])
    correct = torch.tensor([True, True, True, True])
    groups = torch.tensor([0, 1, 0, 1])
    # group 0: min 10 max 30 -> [0.5, -0.5]; group 1: min 100 max 300 -> [0.5, -0.5]
    assert kimi_length_reward(lengths, correct, groups).tolist() == pytest.approx([0.5, 0.5, -0.5, -0.5])


def _sample(text, answer, group, tokens, scorer="exact"):
    return Sample(
        prompt="q",
        completion=text,
        record={"answer": answer, "scorer": scorer, "id": "r"},
        group=group,
        num_tokens=tokens,
        truncated=False,
    )


def test_length_penalty_term_scores_correctness_and_length():
    term = LengthPenalty(weight=0.7, answer_format="hash", fallback_last_number=False)
    samples = [
        _sample("a\n#### 4", "4", 0, 12),
        _sample("b\n#### 4", "4", 0, 20),
        _sample("c\n#### 5", "4", 0, 4),
        _sample("no answer", "4", 0, 28),
    ]
    res = term(samples)
    # min 4, max 28, span 24: lambda = 0.5 - (len-4)/24 = [1/6, -1/6, 0.5, -0.5]
    # correct: rows 0, 1 -> lambda; wrong: row 2 -> min(0, 0.5) = 0, row 3 -> -0.5
    assert res.scores == pytest.approx([1 / 6, -1 / 6, 0.0, -0.5], abs=1e-6)
    assert res.failures == [False] * 4
    assert term.weight == 0.7


def test_length_penalty_term_records_a_failing_sample_as_incorrect():
    term = LengthPenalty(answer_format="hash", fallback_last_number=False)
    samples = [_sample("#### 4", "4", 0, 10), _sample("#### 4", "4", 0, 30, scorer="no-such-scorer")]
    res = term(samples)
    # row 1 raises in the checker: flagged, scored as incorrect -> min(0, -0.5) = -0.5
    assert res.failures == [False, True]
    assert res.scores == pytest.approx([0.5, -0.5])


def test_correct_min_sets_what_counts_as_correct():
    term = LengthPenalty(answer_format="hash", fallback_last_number=False, correct_min=0.5)
    term.accuracy.score = lambda s: 0.6 if s.num_tokens == 10 else 0.4  # partial-credit scorer
    res = term([_sample("x", "4", 0, 10), _sample("y", "4", 0, 20)])
    # span 10: lambda = [0.5, -0.5]; row 0 correct (0.6 >= 0.5), row 1 not -> min(0, -0.5)
    assert res.scores == pytest.approx([0.5, -0.5])


def test_reward_config_length_penalty_composes(tiny_cfg):
    cfg = tiny_cfg("reward=length_penalty")
    terms = {name: instantiate(t) for name, t in cfg.reward.terms.items()}
    assert list(terms) == ["accuracy", "format", "length_penalty"]
    lp = terms["length_penalty"]
    assert isinstance(lp, LengthPenalty) and lp.weight == 1.0 and lp.correct_min == 1.0
    assert lp.accuracy.answer_format == cfg.prompt.answer_format
    assert not math.isnan(lp([_sample("#### 1", "1", 0, 3)]).scores[0])


def test_cosine_length_reward_at_its_boundary_lengths():
    from rlexp.rewards.length import cosine_length_reward

    lengths = torch.tensor([0, 50, 100, 150, 0, 50, 100])
    correct = torch.tensor([True, True, True, True, False, False, False])
    r = cosine_length_reward(lengths, correct, max_len=100)
    # correct: 1.0 at 0, 0.75 half-way, 0.5 at L_max and beyond; wrong: −1.0 at 0, −0.75, −0.5 at L_max
    assert r.tolist() == pytest.approx([1.0, 0.75, 0.5, 0.5, -1.0, -0.75, -0.5])


def test_cosine_length_matches_trl_get_cosine_scaled_reward():
    """Peer parity: TRL's function on \\boxed answers (math-verify) against ours on the same correctness and lengths."""
    trl_rewards = pytest.importorskip("trl.rewards")
    pytest.importorskip("math_verify")
    from rlexp.rewards.length import cosine_length_reward

    fn = trl_rewards.get_cosine_scaled_reward(max_len=64, min_value_wrong=-0.9, max_value_correct=0.8)
    completions = [[{"content": r"\boxed{4}"}], [{"content": r"\boxed{5}"}], [{"content": r"\boxed{4}"}]]
    ids = [[1] * 10, [1] * 40, [1] * 64]
    theirs = fn(completions, solution=["$4$", "$4$", "$4$"], completion_ids=ids)
    ours = cosine_length_reward(
        torch.tensor([10, 40, 64]), torch.tensor([True, False, True]), 64, min_value_wrong=-0.9, max_value_correct=0.8
    )
    assert ours.tolist() == pytest.approx(theirs, abs=1e-6)


def test_cosine_length_term_scores_with_our_checker():
    from rlexp.rewards.length import CosineLength

    term = CosineLength(max_len=20, answer_format="hash", fallback_last_number=False)
    res = term([_sample("a\n#### 4", "4", 0, 10), _sample("b\n#### 5", "4", 0, 20)])
    assert res.scores == pytest.approx([0.75, -0.5])
    with pytest.raises(ValueError, match="max_len"):
        CosineLength(max_len=0)
