"""Paraphrase-set methods by hand: Co-Reward's cross vote, PS-GRPO's group similarity, information-consistent GRPO's
stability reward, the per-wording advantage and the trainer's paraphrased prompts."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.group import grpo
from rlexp.algorithms.group_stages.paraphrase import (
    AnswerStability,
    GroupSimilarity,
    answer_entropy,
    answer_similarity,
    stability_rewards,
    token_f1,
)
from rlexp.algorithms.group_stages.votes import CrossVote, cross_vote_rewards
from rlexp.algorithms.prompt_conditions.paraphrases import ParaphraseSet
from rlexp.core.masks import CONDITION
from tests.algorithms.batches import make_batch

CTX = SimpleNamespace(answer_format="hash")


def batch_of(answers, variants, groups=None, label="7", accuracy_weight=0.0):
    groups = groups or [0] * len(answers)
    b = make_batch(None, groups, terms=[[0.0]] * len(answers), weights=[accuracy_weight])
    b.reward_names = ["accuracy"]
    b.completions = [f"so #### {a}" if a is not None else "no idea" for a in answers]
    b.records = [{"question": "q", "answer": label, "scorer": "math"} for _ in answers]
    b.extras[CONDITION] = torch.tensor(variants, dtype=torch.float32)
    return b


# ---- Co-Reward ----------------------------------------------------------------------------------------------------
def test_cross_vote_scores_each_side_against_the_other_sides_majority():
    # original: 3, 3, 4 (majority 3); rephrased: 4, 4, 3 (majority 4) -> original rows are scored against 4 and the
    # rephrased rows against 3: only row 2 (4 on the original) and row 5 (3 on the rephrased) score
    scores, labels = cross_vote_rewards(["3", "3", "4", "4", "4", "3"], [0, 0, 0, 1, 1, 1])
    assert scores == [0.0, 0.0, 1.0, 0.0, 0.0, 1.0] and labels == {0: "4", 1: "3"}


def test_cross_vote_ties_go_first_seen_and_missing_answers_neither_vote_nor_score():
    # rephrased side: 5, 6 (a tie: 5 seen first) -> label of the original is 5; original side: None, None -> no
    # label for the rephrased side, which scores 0 everywhere; the original's missing answers score 0
    scores, labels = cross_vote_rewards([None, "5", None, "5", "6", "5"], [0, 0, 0, 1, 1, 1])
    assert labels == {0: "5", 1: "5"} and scores == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    scores, labels = cross_vote_rewards([None, None, "5", "6"], [0, 0, 1, 1])
    assert labels == {0: "5", 1: None} and scores == [0.0, 0.0, 0.0, 0.0]


def test_cross_vote_stage_appends_the_reward_and_logs_the_agreement():
    b = batch_of(["7", "7", "7", "8", "7", "7"], [0, 0, 0, 1, 1, 1], label="7")
    CrossVote()(b, CTX)
    assert b.reward_names == ["accuracy", "co_reward"]
    # both majorities are 7: every 7 scores, the rephrased side's 8 does not
    assert b.term("co_reward").tolist() == [1, 1, 1, 0, 1, 1] and b.reward.tolist() == [1, 1, 1, 0, 1, 1]
    assert b.stats["co_reward/label_agreement"] == 1.0 and b.stats["co_reward/pseudo_label_accuracy"] == 1.0
    assert b.stats["co_reward/no_label_frac"] == 0.0


def test_cross_vote_refuses_a_trained_label_and_a_batch_without_wordings():
    with pytest.raises(ValueError, match="weight 1.0: use reward=label_free"):
        CrossVote()(batch_of(["7", "7"], [0, 1], accuracy_weight=1.0), CTX)
    plain = batch_of(["7", "7"], [0, 1])
    del plain.extras[CONDITION]
    with pytest.raises(ValueError, match="ParaphraseSet"):
        CrossVote()(plain, CTX)


def test_advantage_by_condition_normalises_each_wording_apart():
    # rewards 1, 0 | 1, 1 in one group: by wording, the second half has no spread (advantage 0); the first half is
    # ±1/std with std = sqrt(0.5) -> ±0.7071; over the whole group they would all differ from 0
    b = make_batch([1.0, 0.0, 1.0, 1.0], [0, 0, 0, 0])
    b.extras[CONDITION] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    by = grpo(b, by_condition=True)
    assert by.tolist() == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-3)
    assert grpo(b)[2] > 0
    del b.extras[CONDITION]
    with pytest.raises(ValueError, match="by_condition=true needs algorithm.prompt_condition"):
        grpo(b, by_condition=True)


# ---- PS-GRPO ------------------------------------------------------------------------------------------------------
def test_similarity_is_equivalence_else_token_f1():
    assert answer_similarity("0.5", "1/2") == 1.0  # math-equivalent
    assert token_f1("the Eiffel Tower", "Eiffel Tower Paris") == pytest.approx(0.8)  # p = 2/2, r = 2/3
    assert answer_similarity("Paris", None) == 0.0 and token_f1("", "") == 1.0


def test_group_similarity_averages_over_the_other_paraphrases_only():
    # wordings 0, 0, 1, 1 with answers 7, 8, 7, 7: row 0 vs rows 2, 3 -> (1 + 1)/2 = 1; row 1 (8) -> 0;
    # row 2 vs rows 0, 1 -> (1 + 0)/2 = 0.5; row 3 the same; cross pairs equal: (0,2) (0,3) of 4 -> 0.5
    b = batch_of(["7", "8", "7", "7"], [0, 0, 1, 1])
    GroupSimilarity(weight=1.0)(b, CTX)
    assert b.term("group_similarity").tolist() == [1.0, 0.0, 0.5, 0.5]
    assert b.stats["paraphrase/answer_agreement"] == 0.5
    assert b.stats["ps_grpo/similarity_mean"] == 0.5


def test_group_similarity_sampled_approximation_compares_with_m_others():
    b = batch_of(["7", "8", "7", "7", "9", "7"], [0, 0, 1, 1, 2, 2])
    GroupSimilarity(sample=1, seed=3)(b, CTX)
    got = b.term("group_similarity").tolist()
    assert all(s in (0.0, 1.0) for s in got)  # one comparison each: a 0/1 similarity
    exact = batch_of(["7", "8", "7", "7", "9", "7"], [0, 0, 1, 1, 2, 2])
    GroupSimilarity()(exact, CTX)
    assert exact.term("group_similarity")[0] == pytest.approx(3 / 4)  # 7 vs 7, 7, 9, 7
    with pytest.raises(ValueError, match="compare='bleu'"):
        GroupSimilarity(compare="bleu")


# ---- information-consistent GRPO ----------------------------------------------------------------------------------
def test_stability_is_the_drop_of_the_answer_entropy():
    # answers A, A, A, B: H = H(3/4, 1/4) = 0.5623 nats; without an A: H(2/3, 1/3) = 0.6365 -> +0.0742;
    # without B: H = 0 -> −0.5623
    assert answer_entropy([0, 0, 0, 1]) == pytest.approx(0.5623, abs=1e-4)
    got = stability_rewards([0, 0, 0, 1])
    assert got == pytest.approx([0.0742, 0.0742, 0.0742, -0.5623], abs=1e-4)
    # a missing answer is an outlier of its own: A, A, none -> same as A, A, B
    assert stability_rewards([0, 0, -1]) == pytest.approx(stability_rewards([0, 0, 1]))
    assert answer_entropy([0, 0, 0, 0]) == 0.0 and stability_rewards([0, 0]) == [0.0, 0.0]


def test_stability_stage_logs_entropy_and_stable_groups():
    b = batch_of(["7", "7", "7", "7", "3", "4", "3", None], [0, 0, 1, 1] * 2, groups=[0] * 4 + [1] * 4)
    AnswerStability(weight=0.5)(b, CTX)
    assert b.term("stability")[:4].tolist() == [0.0] * 4  # a stable group: nothing to gain
    assert b.reward[4] == pytest.approx(0.5 * b.term("stability")[4])
    assert b.stats["info_consistent/stable_group_frac"] == 0.5
    h = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert b.stats["info_consistent/answer_entropy_mean"] == pytest.approx(h / 2)


# ---- the prompt condition and the trainer ------------------------------------------------------------------------
def test_paraphrase_set_values_and_the_trainers_prompts(tiny):
    from rlexp.data.prompts import PromptFormat
    from rlexp.trainer.loop import Trainer

    cond = ParaphraseSet(k=2, source="template", seed=0)
    assert cond.values(4) == [0.0, 1.0]
    with pytest.raises(ValueError, match="k=2 does not divide trainer.num_generations=3"):
        cond.values(3)
    with pytest.raises(ValueError, match="k=1 must be >= 2"):
        ParaphraseSet(k=1)
    fmt = PromptFormat(answer_format="hash", system_prompt="sys", instruction="End with '#### <answer>'.")
    records = [{"id": "a", "question": "Calculate 2 + 2."}]
    prompts = [fmt.render(tiny.tokenizer, records[0]["question"])]
    fake = SimpleNamespace(
        algo=SimpleNamespace(prompt_condition=cond), num_generations=4, prompt_format=fmt, tok=tiny.tokenizer
    )
    variants, values = Trainer._condition_variants(fake, records, prompts)
    assert variants[0] == prompts[0]  # variant 0: the question itself
    paraphrase = cond.question("Calculate 2 + 2.", 1.0, records[0])
    assert paraphrase != "Calculate 2 + 2." and paraphrase in variants[1] and "2 + 2" in paraphrase
    fake._condition_variants = lambda r, p: Trainer._condition_variants(fake, r, p)
    rows, conditions = Trainer._row_conditions(fake, records, prompts)
    assert conditions.tolist() == [0.0, 0.0, 1.0, 1.0] and rows[2] == variants[1]
