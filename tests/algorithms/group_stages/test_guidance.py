"""GHPO's hinted retries (rlexp/algorithms/group_stages/guidance.py): which groups get hints, the hint text, the
ratio schedule, the replacement of a group's rows (real rollouts of the tiny model), and a two-step tiny run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.guidance import (
    HINT_TEMPLATE,
    HintedRetry,
    all_wrong_groups,
    hint_source,
    hinted_question,
)
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import CONDITION
from rlexp.data.prompts import PromptFormat
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import RewardTerm
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run

# an arithmetic record as reasoning-gym's basic_arithmetic gives it: its worked solution is "12 + 30 - 7 = 35"
RECORD = {"question": "What is 12 + 30 - 7?", "answer": "35", "metadata": {"expression": "12 + 30 - 7"}}
INTRO = "\nThe following text is the beginning part of the answer, which you can refer to for solving the problem:\n"


# ---------------------------------------------------------------- hint construction by hand


def test_the_hint_is_the_first_share_of_the_worked_solution_after_ghpos_sentence():
    solution = hint_source(RECORD)
    assert solution == "12 + 30 - 7 = 35"  # 7 words
    # ω = 0.25: round(7 · 0.25) = round(1.75) = 2 words; 0.5: round(3.5) = 4; 0.75: round(5.25) = 5
    assert hinted_question(RECORD["question"], solution, 0.25) == "What is 12 + 30 - 7?" + INTRO + "12 +"
    assert hinted_question(RECORD["question"], solution, 0.5) == "What is 12 + 30 - 7?" + INTRO + "12 + 30 -"
    assert hinted_question(RECORD["question"], solution, 0.75) == "What is 12 + 30 - 7?" + INTRO + "12 + 30 - 7"
    assert HINT_TEMPLATE.format(question="Q", hint="H") == "Q" + INTRO + "H"


def test_the_hint_source_prefers_the_demonstration_column_and_is_none_without_a_solution():
    assert hint_source({**RECORD, "demonstration": "  Add, then subtract.\n#### 35 "}) == "Add, then subtract.\n#### 35"
    gsm = {"question": "q", "answer": "72", "metadata": {"solution": "3*4=<<3*4=12>>12 apples\n#### 72"}}
    assert hint_source(gsm) == "3*4=12 apples"  # GSM8K's calculator notes and answer line are not part of it
    assert hint_source({"question": "q", "answer": "1", "metadata": {}}) is None
    assert hint_source({"question": "q", "answer": "1"}) is None


def test_only_groups_wrong_on_every_completion_get_hints():
    # groups 0 (0, 0), 1 (1, 0: one correct), 2 (0, 0), 3 (-1, 0: a ±1 accuracy is wrong at -1 too), 4 (0.5, 0)
    acc = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.5, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert all_wrong_groups(acc, groups) == [0, 2, 3]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fractions": []}, "fractions is empty"),
        ({"fractions": [0.5, 0.25]}, "must increase"),
        ({"fractions": [0.0, 0.5]}, r"in \(0, 1\]"),
        ({"fractions": [0.5, 1.5]}, r"in \(0, 1\]"),
        ({"template": "{question} only"}, "must contain"),
        ({"start_step": -1}, "start_step"),
    ],
)
def test_bad_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HintedRetry(**kwargs)


# ---------------------------------------------------------------- replacement on the tiny model


class Unlocked(RewardTerm):
    """A test accuracy: 1 when the row's prompt holds the record's ``unlock`` text (so a hint can solve a group)."""

    def score(self, sample) -> float:
        return float(sample.record["metadata"]["unlock"] in sample.prompt)


def _record(question, unlock, expression="1 + 2 + 3 + 4"):
    meta = {"unlock": unlock} if expression is None else {"unlock": unlock, "expression": expression}
    return {"question": question, "answer": "10", "metadata": meta}


@pytest.fixture
def setup(tiny):
    fmt = PromptFormat(system_prompt="Solve it.", answer_format="hash")
    rollout = HFRollout(max_new_tokens=4, temperature=1.0, inference_dtype=None)
    terms = {"accuracy": Unlocked()}
    ctx = SimpleNamespace(
        policy=tiny.model,
        tokenizer=tiny.tokenizer,
        rollout=rollout,
        reward_terms=terms,
        prompt_format=fmt,
        autocast_dtype=None,
        step=1,
    )
    # the solution "1 + 2 + 3 + 4 = 10" has 9 words: ω = 0.25 shows "1 +", 0.5 shows round(4.5) = 4 words
    # "1 + 2 +", 0.75 shows round(6.75) = 7 words "1 + 2 + 3 + 4"
    records = [
        _record("Add the numbers (A).", unlock="1 + 2 +"),  # all wrong; solved from ω = 0.5
        _record("Add the numbers (B) OPEN.", unlock="OPEN"),  # solved without a hint: left alone
        _record("Add the numbers (C).", unlock="never"),  # never solved: ends with the ω = 0.75 rows
        _record("Add the numbers (D).", unlock="never", expression=None),  # all wrong, no solution: left, counted
    ]
    torch.manual_seed(0)
    prompts = [fmt.render(tiny.tokenizer, r["question"]) for r in records]
    out = rollout.generate(tiny.model, tiny.tokenizer, prompts, num_generations=2)
    gid = torch.arange(4).repeat_interleave(2)
    rows = [p for p in prompts for _ in range(2)]
    batch = RolloutBatch.from_generation(out, gid, rows, [r for r in records for _ in range(2)])
    score(batch, terms)
    batch.stats["time/reward_s"] = 0.5
    return batch, ctx, prompts


def test_all_wrong_groups_are_rolled_out_again_with_growing_hints_and_replaced(setup, tiny):
    batch, ctx, prompts = setup
    before = batch.select(torch.arange(len(batch)))
    out = HintedRetry(accuracy_term="accuracy")(batch, ctx)
    s = out.stats
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # same groups, same order, same sizes
    # A: ω = 0.25 all wrong, ω = 0.5 solved (its prompt holds "1 + 2 +"); C: all three rounds, kept at 0.75
    solution = "1 + 2 + 3 + 4 = 10"
    a_prompt = ctx.prompt_format.render(tiny.tokenizer, hinted_question("Add the numbers (A).", solution, 0.5))
    c_prompt = ctx.prompt_format.render(tiny.tokenizer, hinted_question("Add the numbers (C).", solution, 0.75))
    assert out.prompts[0:2] == [a_prompt] * 2 and out.prompts[4:6] == [c_prompt] * 2
    assert "1 + 2 + 3 + 4" in c_prompt and "1 + 2 + 3 + 4" not in a_prompt
    assert out.term("accuracy").tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # the update conditions on the hint: the rows' prompt ids are the hinted prompt's tokens
    a_ids = out.prompt_ids[0][out.prompt_mask[0].bool()].tolist()
    assert a_ids == tiny.tokenizer(a_prompt, add_special_tokens=False)["input_ids"]
    # B (solved) and D (no solution) keep their rows as they were
    for rows in ([2, 3], [6, 7]):
        kept = out.select(rows)
        ref = before.select(rows)
        assert kept.prompts == ref.prompts and kept.completions == ref.completions
        w = ref.completion_ids.shape[1]
        assert torch.equal(kept.completion_ids[:, :w], ref.completion_ids)
        assert torch.equal(kept.sampling_logprobs[:, :w], ref.sampling_logprobs)
    assert s["ghpo/all_wrong_groups"] == 3.0  # A, C, D
    assert s["ghpo/missing_solution"] == 1.0  # D
    assert s["ghpo/hinted_groups"] == 2.0  # A, C
    assert s["ghpo/hint_fraction_mean"] == pytest.approx((0.5 + 0.75) / 2)
    assert s["ghpo/hinted_accuracy"] == pytest.approx(0.5)  # A's two rows right, C's two wrong
    assert s["ghpo/solved_with_hint"] == 1.0
    assert s["ghpo/retries"] == 3.0  # ω = 0.25 (A, C), 0.5 (A, C), 0.75 (C)
    assert s["ghpo/accuracy_before_hints"] == pytest.approx(0.25)  # B's two rows of eight
    assert s["time/reward_s"] > 0.5 and s["time/ghpo_generate_s"] > 0  # the retries' scoring time is added
    assert out.reward.tolist() == out.term("accuracy").tolist()
    assert out.completion_mask.shape[0] == 8 and out.sampling_logprobs.shape == out.completion_ids.shape


def test_no_hints_before_start_step_or_when_a_group_is_solved(setup):
    batch, ctx, _ = setup
    same = HintedRetry(start_step=1)(batch, ctx)  # step 1 is the first step: one step without hints
    assert same is batch and same.stats["ghpo/hinted_groups"] == 0.0 and same.stats["ghpo/retries"] == 0.0
    solved = batch.select([2, 3])  # group B only
    out = HintedRetry()(solved, ctx)
    assert out.stats["ghpo/hinted_groups"] == 0.0 and out.stats["ghpo/all_wrong_groups"] == 0.0
    assert out.prompts == solved.prompts


def test_refuses_what_it_cannot_fill_for_the_hinted_rows(setup):
    batch, ctx, _ = setup
    batch.extras[CONDITION] = torch.zeros(len(batch))
    with pytest.raises(ValueError, match="put it first among the group stages"):
        HintedRetry()(batch, ctx)
    del batch.extras[CONDITION]
    with pytest.raises(KeyError, match="accuracy_term='correct'"):
        HintedRetry(accuracy_term="correct")(batch, ctx)
    with pytest.raises(RuntimeError, match="prompt_format"):
        HintedRetry()(batch, SimpleNamespace(**{**vars(ctx), "prompt_format": None}))


# ---------------------------------------------------------------- two steps on the tiny model


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_ghpo_trains_two_steps_with_hinted_groups(tiny_cfg):
    # the real accuracy term: the tiny random model never answers right, so every group is all-wrong and hinted
    # (the default task's records carry metadata.expression, so each has a solution)
    overrides = ["algorithm=ghpo", "trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]
    result = run(tiny_cfg(*overrides))
    m = result.metrics
    assert result.last_step == 2
    assert m["ghpo/hinted_groups"] == 2.0  # both prompts of the step
    assert m["ghpo/hint_fraction_mean"] == pytest.approx(0.75)  # never solved: the last share
    assert m["ghpo/retries"] == 3.0 and m["ghpo/missing_solution"] == 0.0
    assert m["ghpo/hinted_accuracy"] == 0.0
