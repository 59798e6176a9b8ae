"""DR-PO's dataset resets (rlexp/algorithms/group_stages/guidance.py, DatasetReset): the prefix lengths, the reset
plan, the rebuilt rows on the tiny model (prefix in the completion and out of the loss, the policy's log-probs on it,
the whole completion scored), the checks, and a two-step tiny run (conf/algorithm/dr_po.yaml)."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.guidance import DatasetReset, left_padded, plan_resets, prefix_range
from rlexp.core.batch import RolloutBatch
from rlexp.core.forward import token_logprobs
from rlexp.core.masks import CONDITION, TOKEN_LOSS_MASK, loss_mask
from rlexp.data.demonstrations import demonstration
from rlexp.data.prompts import PromptFormat
from rlexp.rewards.scoring import score
from rlexp.rewards.terms import RewardTerm
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=6", "trainer.num_generations=2"]


# ---------------------------------------------------------------- prefix lengths and the plan, by hand


def test_the_prefix_never_takes_the_eos_and_leaves_the_policy_a_token():
    # h ≤ min(L − 1, T − 1): L = 5 tokens (EOS included), T = 8 → 4; L = 10, T = 6 → 5; L = 1 (EOS alone) → 0
    assert prefix_range(5, 8) == 4 and prefix_range(10, 6) == 5 and prefix_range(1, 8) == 0
    assert prefix_range(5, 1) == 0  # one completion token: nothing left for the policy


class ScriptedRng:
    """A ``random.Random`` stand-in that returns the given draws and records randint's bounds."""

    def __init__(self, randoms, ints):
        self.randoms, self.ints, self.bounds = list(randoms), list(ints), []

    def random(self):
        return self.randoms.pop(0)

    def randint(self, a, b):
        self.bounds.append((a, b))
        return self.ints.pop(0)


def test_group_resets_share_one_prefix_length():
    # groups [0, 1], [2, 3], [4, 5] with longest prefixes 3, 0 (no demonstration), 2; β = 0.5
    # group 0: 0.2 < 0.5 resets, h = 2 for both rows; group 1: skipped without a draw; group 2: 0.7 ≥ 0.5 stays
    rng = ScriptedRng([0.2, 0.7], [2])
    plan = plan_resets([[0, 1], [2, 3], [4, 5]], [3, 0, 2], 0.5, "group", rng)
    assert plan == [(0, 2), (1, 2)]
    assert rng.bounds == [(1, 3)]  # h uniform on 1 … longest


def test_row_resets_draw_each_row():
    # rows 0, 1, 2 of one group, longest 3, β = 0.5: draws 0.1 (reset, h = 3), 0.9 (stays), 0.4 (reset, h = 1)
    rng = ScriptedRng([0.1, 0.9, 0.4], [3, 1])
    assert plan_resets([[0, 1, 2]], [3], 0.5, "row", rng) == [(0, 3), (2, 1)]
    assert rng.bounds == [(1, 3), (1, 3)]


def test_every_or_no_row_resets_at_beta_one_or_zero():
    groups, longest = [[0, 1], [2, 3]], [4, 1]
    plan = plan_resets(groups, longest, 1.0, "row", random.Random(3))
    assert [r for r, _ in plan] == [0, 1, 2, 3]
    assert all(1 <= h <= 4 for _, h in plan[:2]) and [h for _, h in plan[2:]] == [1, 1]
    assert plan_resets(groups, longest, 0.0, "group", random.Random(3)) == []


def test_contexts_are_left_padded():
    ids, mask = left_padded([[5, 6], [7]], 0, "cpu")
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]


@pytest.mark.parametrize(
    "kwargs, match",
    [({"reset_prob": 1.5}, "reset_prob=1.5"), ({"unit": "prompt"}, "unit='prompt'"), ({"start_step": -1}, "start")],
)
def test_bad_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DatasetReset(**kwargs)


# ---------------------------------------------------------------- the rebuilt rows on the tiny model


class StartsWithOne(RewardTerm):
    """A test accuracy: 1 when the completion starts with "1" — every demonstration below does ("1 + 2 + 3 + 4 = 10"),
    the tiny random model's own completions (almost) never."""

    def score(self, sample) -> float:
        return float(sample.completion.startswith("1"))


RECORDS = [
    {"question": "Add the numbers (A).", "answer": "10", "metadata": {"expression": "1 + 2 + 3 + 4"}},
    {"question": "Add the numbers (B).", "answer": "10", "metadata": {"expression": "1 + 2 + 3 + 4"}},
    {"question": "Add the numbers (C).", "answer": "10", "metadata": {}},  # no demonstration: left as it is
]
T = 8


@pytest.fixture
def setup(tiny):
    fmt = PromptFormat(system_prompt="Solve it.", answer_format="hash")
    rollout = HFRollout(max_new_tokens=T, temperature=1.0, inference_dtype=None)
    terms = {"accuracy": StartsWithOne()}
    ctx = SimpleNamespace(
        policy=tiny.model,
        tokenizer=tiny.tokenizer,
        rollout=rollout,
        reward_terms=terms,
        answer_format="hash",
        autocast_dtype=None,
        step=1,
        settings=SimpleNamespace(micro_batch_size=2),
    )
    torch.manual_seed(0)
    prompts = [fmt.render(tiny.tokenizer, r["question"]) for r in RECORDS]
    out = rollout.generate(tiny.model, tiny.tokenizer, prompts, num_generations=2)
    gid = torch.arange(3).repeat_interleave(2)
    batch = RolloutBatch.from_generation(
        out, gid, [p for p in prompts for _ in range(2)], [r for r in RECORDS for _ in range(2)]
    )
    score(batch, terms)
    batch.stats["time/reward_s"] = 0.5
    return batch, ctx


def test_reset_rows_carry_the_prefix_in_the_completion_and_out_of_the_loss(setup, tiny):
    batch, ctx = setup
    before = batch.select(torch.arange(len(batch)))
    out = DatasetReset(reset_prob=1.0, unit="group", seed=0)(batch, ctx)
    tok = tiny.tokenizer
    demo = tok(demonstration(RECORDS[0], "hash"), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    keep = out.extras[TOKEN_LOSS_MASK]
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2] and out.prompts == before.prompts
    assert torch.equal(out.prompt_ids, before.prompt_ids)  # the prompt is unchanged: the prefix is in the completion
    hs = []
    for i in range(4):  # groups A and B reset
        h = int((keep[i] == 0).sum())
        hs.append(h)
        assert 1 <= h <= min(len(demo) - 1, T - 1)
        assert keep[i, :h].tolist() == [0.0] * h and bool((keep[i, h:] == 1).all())
        assert out.completion_ids[i, :h].tolist() == demo[:h]  # the demonstration's first h tokens
        n = int(out.completion_mask[i].sum())
        assert h < n <= T  # the policy wrote at least one token; prefix + continuation within T
        assert out.completions[i] == tok.decode(out.completion_ids[i, :n].tolist(), skip_special_tokens=True)
    assert hs[0] == hs[1] and hs[2] == hs[3]  # unit=group: one h per group
    # the whole completion is scored: every reset row starts with the demonstration's "1"
    assert out.term("accuracy")[:4].tolist() == [1.0] * 4
    # the prefix tokens' sampling log-probs are the policy's own, at the rollout temperature
    for i in range(4):
        h = hs[i]
        lp = token_logprobs(
            tiny.model,
            out.prompt_ids[i : i + 1],
            out.prompt_mask[i : i + 1],
            out.completion_ids[i : i + 1, :h],
            torch.ones(1, h, dtype=out.completion_mask.dtype),
            1.0,
            share_prompts=False,
        )[0]
        torch.testing.assert_close(out.sampling_logprobs[i, :h], lp[0], atol=1e-5, rtol=1e-5)
        n = int(out.completion_mask[i].sum())
        assert bool((out.sampling_logprobs[i, :n] < 0).all())
    # group C (no demonstration) keeps its rows, fully in the loss
    w = before.completion_ids.shape[1]
    assert out.completions[4:] == before.completions[4:]
    assert torch.equal(out.completion_ids[4:, :w], before.completion_ids[4:])
    assert bool((keep[4:] == 1).all())
    # the loss mask: completion mask × token loss mask (the prefix out)
    lm = loss_mask(out)
    assert int(lm[:4].sum()) == int(out.completion_mask[:4].sum()) - sum(hs)
    s = out.stats
    assert s["drpo/reset_rows"] == 4.0 and s["drpo/reset_groups"] == 2.0 and s["drpo/missing"] == 1.0
    assert s["drpo/prefix_tokens_mean"] == pytest.approx(sum(hs) / 4)
    assert s["drpo/prefix_frac_mean"] == pytest.approx(sum(hs) / 4 / len(demo))
    assert s["drpo/reset_accuracy"] == 1.0
    assert s["drpo/accuracy_before_resets"] == pytest.approx(float(before.term("accuracy").mean()))
    assert s["time/reward_s"] > 0.5 and s["time/drpo_generate_s"] > 0
    assert out.reward.tolist() == out.term("accuracy").tolist()


def test_row_resets_leave_the_other_rows_as_they_were(setup):
    batch, ctx = setup
    before = batch.select(torch.arange(len(batch)))
    stage = DatasetReset(reset_prob=0.5, unit="row", seed=1)
    out = stage(batch, ctx)
    keep = out.extras[TOKEN_LOSS_MASK]
    reset = [i for i in range(6) if bool((keep[i] == 0).any())]
    # the same draws as plan_resets with the stage's seeded generator ("<seed>:<step>"; C has no demonstration)
    top = prefix_range(
        len(ctx.tokenizer(demonstration(RECORDS[0], "hash"), add_special_tokens=False)["input_ids"]) + 1, T
    )
    expected = plan_resets([[0, 1], [2, 3], [4, 5]], [top, top, 0], 0.5, "row", random.Random("1:1"))
    assert reset == [r for r, _ in expected] and 0 < len(reset) < 4
    assert out.stats["drpo/reset_rows"] == float(len(reset))
    w = before.completion_ids.shape[1]
    for i in set(range(6)) - set(reset):
        assert out.completions[i] == before.completions[i]
        assert torch.equal(out.completion_ids[i, :w], before.completion_ids[i])
        assert torch.equal(out.sampling_logprobs[i, :w], before.sampling_logprobs[i])


def test_no_resets_before_start_step_or_at_beta_zero(setup):
    batch, ctx = setup
    same = DatasetReset(start_step=1)(batch, ctx)
    assert same is batch and same.stats["drpo/reset_rows"] == 0.0 and TOKEN_LOSS_MASK not in same.extras
    none = DatasetReset(reset_prob=0.0)(batch, ctx)
    assert none is batch and none.stats["drpo/reset_rows"] == 0.0 and none.stats["drpo/missing"] == 1.0


def test_refuses_what_it_cannot_rebuild(setup):
    batch, ctx = setup
    with pytest.raises(RuntimeError, match="rollout=hf"):
        DatasetReset()(batch, SimpleNamespace(**{**vars(ctx), "rollout": SimpleNamespace(max_new_tokens=T)}))
    with pytest.raises(KeyError, match="accuracy_term='correct'"):
        DatasetReset(accuracy_term="correct")(batch, ctx)
    batch.extras[CONDITION] = torch.zeros(len(batch))
    with pytest.raises(ValueError, match="put it first among the group stages"):
        DatasetReset()(batch, ctx)


# ---------------------------------------------------------------- two steps on the tiny model


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_dr_po_trains_two_steps_from_dataset_resets(tiny_cfg):
    # the default task's records carry metadata.expression: each has a demonstration, every group resets (β = 1)
    result = run(tiny_cfg(*VARYING, *FAST, "algorithm=dr_po"))
    m = result.metrics
    assert result.last_step == 2
    assert m["drpo/reset_rows"] == 4.0 and m["drpo/reset_groups"] == 2.0 and m["drpo/missing"] == 0.0
    assert 1.0 <= m["drpo/prefix_tokens_mean"] <= 5.0  # h ≤ max_new_tokens − 1
    assert 0.0 < m["drpo/prefix_frac_mean"] < 1.0
    assert 0.0 <= m["drpo/reset_accuracy"] <= 1.0 and "drpo/accuracy_before_resets" in m
    assert m["advantage/abs_mean"] > 0 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
