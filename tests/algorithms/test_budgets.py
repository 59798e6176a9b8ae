"""HBPO's budget subgroups and budget-aware reward (arXiv 2507.15844) and e1's effort prompts, by hand."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from rlexp.algorithms.advantages.budget import budget_reward, hbpo
from rlexp.algorithms.prompt_conditions.budgets import BudgetPrefill, EffortPrompt
from rlexp.core.masks import CONDITION
from tests.algorithms.batches import make_batch


def test_budget_reward_at_its_boundaries():
    f2 = lambda b: 4 * math.cos(math.pi * b / 200)  # noqa: E731  (L_max = 100, β = 4)
    correct = torch.tensor([True, True, True, False])
    lengths = torch.tensor([10, 20, 30, 10])
    budgets = torch.tensor([20.0, 20.0, 20.0, 20.0])
    r = budget_reward(correct, lengths, budgets, l_max=100, beta=4.0, alpha=0.01)
    assert r[0].item() == pytest.approx(f2(20))  # inside the budget: the budget's reward, whatever the length
    assert r[1].item() == pytest.approx(f2(20))  # n = b: still inside
    assert r[2].item() == pytest.approx(4 * math.cos(math.pi * 30 / 200) - 0.01 * 10)  # past it: cosine − α·overshoot
    assert r[3].item() == 0.0  # wrong


def test_hbpo_advantage_inter_plus_intra():
    b = make_batch(None, [0, 0, 0, 0], lengths=[10, 5, 50, 30], width=50, terms=[[1.0], [0.0], [1.0], [1.0]])
    b.reward_names = ["accuracy"]
    b.extras[CONDITION] = torch.tensor([20.0, 20.0, 40.0, 40.0])
    adv = hbpo(b, l_max=100, beta=4.0, alpha=0.01, eps=0.0)
    f2 = lambda x: 4 * math.cos(math.pi * x / 200)  # noqa: E731
    r = [f2(20), 0.0, 4 * math.cos(math.pi * 50 / 200) - 0.1, f2(40)]
    mean, std = statistics.mean(r), statistics.stdev(r)
    intra = [statistics.mean(r[:2]) - f2(20)] * 2 + [statistics.mean(r[2:]) - f2(40)] * 2
    for i in range(4):
        assert adv[i].item() == pytest.approx((r[i] - mean) / std + intra[i], rel=1e-5)
    assert b.stats["hbpo/within_budget_frac"] == 0.75


def test_hbpo_needs_budgets_and_the_accuracy_term():
    b = make_batch([1.0, 0.0], [0, 0])
    with pytest.raises(ValueError, match="prompt_condition"):
        hbpo(b, l_max=10)
    b.extras[CONDITION] = torch.tensor([1.0, 2.0])
    with pytest.raises(KeyError, match="metric"):
        hbpo(b, l_max=10)


def test_budget_prefill_renders_scaled_budgets_and_checks_the_group_size():
    cond = BudgetPrefill(values=[0.125, 0.25, 0.5, 0.625], scale=128)
    assert cond.values(8) == [16, 32, 64, 80]
    assert cond.render("<prompt>", 64) == "<prompt><think> I will answer the question with 64 tokens"
    with pytest.raises(ValueError, match="num_generations=6"):
        cond.values(6)
    with pytest.raises(ValueError, match="positive"):
        BudgetPrefill(values=[0, 1])
    effort = EffortPrompt(values=[0.5, 1.0], template="effort {value}")
    assert effort.position == "user" and effort.question("q?", 0.5) == "q?\neffort 0.5"
    assert effort.render("p", 1.0) == "peffort 1"
    with pytest.raises(ValueError, match="position"):
        EffortPrompt(position="system")


def test_e1_effort_reward_against_the_group_average():
    from rlexp.algorithms.group_stages.effort import EffortReward

    b = make_batch(None, [0, 0, 0, 0], lengths=[2, 6, 4, 8], width=8, terms=[[1.0], [1.0], [1.0], [0.0]])
    b.reward_names = ["accuracy"]
    b.extras[CONDITION] = torch.tensor([0.5, 0.5, 1.0, 1.0])
    EffortReward()(b)
    # T_avg = 5: targets 2.5, 2.5, 5, 5; row 1 (correct, 6 > 2.5) loses its reward, row 3 was wrong anyway;
    # row 0 (2 <= 2.5) and row 2 (4 <= 5) keep it
    assert b.reward_names == ["accuracy", "effort_penalty"]
    assert b.term("effort_penalty").tolist() == [0.0, -1.0, 0.0, 0.0]
    assert b.reward.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert b.stats["e1/within_effort_frac"] == 0.5 and b.stats["e1/penalised_frac"] == 0.25
    edge = make_batch(None, [0, 0], lengths=[2, 2], terms=[[1.0], [1.0]])
    edge.reward_names = ["accuracy"]
    edge.extras[CONDITION] = torch.tensor([1.0, 1.0])
    EffortReward()(edge)  # ℓ = r·T_avg exactly: within
    assert edge.reward.tolist() == [1.0, 1.0]
    plain = make_batch(None, [0], terms=[[1.0]])
    plain.reward_names = ["accuracy"]
    with pytest.raises(ValueError, match="EffortPrompt"):
        EffortReward()(plain)


def test_trainer_renders_user_and_assistant_conditions(tiny):
    """The trainer's prompt variants: e1's effort inside the user's turn, HBPO's budget after the generation prompt."""
    from types import SimpleNamespace

    from rlexp.data.prompts import PromptFormat
    from rlexp.trainer.loop import Trainer

    fmt = PromptFormat(answer_format="hash", system_prompt="sys", instruction="End with '#### <answer>'.")
    records = [{"question": "What is 2 + 2?"}]
    prompts = [fmt.render(tiny.tokenizer, records[0]["question"])]
    for cond, inside_user in ((EffortPrompt(values=[0.5, 1.0]), True), (BudgetPrefill(values=[8, 16]), False)):
        fake = SimpleNamespace(
            algo=SimpleNamespace(prompt_condition=cond), num_generations=4, prompt_format=fmt, tok=tiny.tokenizer
        )
        variants, values = Trainer._condition_variants(fake, records, prompts)
        assert len(variants) == 2 and values == cond.values(4)
        text = cond.text(values[0])
        if inside_user:  # the condition comes before the assistant's turn opens
            assert text in variants[0] and variants[0].endswith(prompts[0][-20:]) and not prompts[0].endswith(text)
        else:
            assert variants[0] == prompts[0] + text
