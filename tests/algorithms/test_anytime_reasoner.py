"""AnytimeReasoner + BRPO: the budget prior, the thinking end, the truncation positions, BRPO's baseline on a worked
example, the token advantages, the summary rollout and two training steps."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.advantages.budget import brpo, brpo_segment_advantages
from rlexp.algorithms.group_stages.anytime import AnytimeBudgets, budget_prior, think_end
from rlexp.core.batch import RolloutBatch
from rlexp.rewards.terms import TermResult
from rlexp.rollout.hf import HFRollout, RolloutOutput
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING


def test_budget_priors():
    assert budget_prior([2, 4, 6, 8], "uniform") == [0.25] * 4
    assert budget_prior([2, 4, 6, 8], "linear") == pytest.approx([0.1, 0.2, 0.3, 0.4])  # b_j / 20
    assert budget_prior([2, 4, 6, 8], "base") == [0.0, 0.0, 0.0, 1.0]
    assert budget_prior([2, 4], [1, 3]) == [0.25, 0.75]
    with pytest.raises(ValueError, match="prior"):
        budget_prior([2, 4], "cosine")


def test_budgets_scale_and_must_increase():
    assert AnytimeBudgets(budgets=[0.25, 0.5, 0.75, 1.0], scale=8).budgets == [2, 4, 6, 8]
    with pytest.raises(ValueError, match="strictly increasing"):
        AnytimeBudgets(budgets=[0.25, 0.3], scale=4)  # 1, 1


def test_think_end_counts_tokens_through_the_closing_tag():
    assert think_end(["<think>", "a", " b", "</", "think>", "<answer>"]) == (5, True)
    assert think_end(["<think>", "a", "</think>\n"]) == (3, True)  # the tag inside a merged token
    assert think_end(["<think>", "a", " b"]) == (3, False)


def test_brpo_worked_example():
    # one group of 2, J = 2 budgets, p = (0.5, 0.5); scores r = [[1, 1], [0, 1]]
    # R_0 = (1, 0.5), R_1 = (0.5, 0.5); V2_0 = 0.75, V2_1 = 0.5
    # j = 0: baseline V2 = 0.75 → A = (0.25, −0.25)
    # j = 1: V1 = r_0 · p_1 = (0.5, 0); baseline (1·V1 + 1·V2)/2 = (0.5, 0.25) → A = (0, 0.25)
    r = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    p = torch.tensor([0.5, 0.5])
    g = torch.tensor([0, 0])
    assert torch.allclose(brpo_segment_advantages(r, p, g), torch.tensor([[0.25, 0.0], [-0.25, 0.25]]))
    # GRPO's baseline alone (V2): j = 1 → 0.5 − 0.5 = 0
    assert torch.allclose(brpo_segment_advantages(r, p, g, "group"), torch.tensor([[0.25, 0.0], [-0.25, 0.0]]))


def test_brpo_v1_uses_the_discounted_earlier_scores():
    # a group of two equal rows, J = 3, p uniform (1/3 each), r = (1, 0, 1): V2 = R
    # j = 2: V1 = (1·1 + 2·0)/(1 + 2) · 1/3 = 1/9; R_2 = 1/3; baseline (2·1/9 + 1·1/3)/3 = 5/27 → A = 1/3 − 5/27 = 4/27
    r = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    a = brpo_segment_advantages(r, torch.full((3,), 1 / 3), torch.tensor([0, 0]))
    assert a[0, 2].item() == pytest.approx(4 / 27)
    assert a[0, 0].item() == pytest.approx(0.0)  # j = 0: baseline V2 = R_0 itself
    # one row alone in its group: V2 = 0 (the released code's G = 1), so j = 0 gets R_0 = 2/3 and j = 2
    # 1/3 − (2·1/9)/3 = 7/27
    a = brpo_segment_advantages(r[:1], torch.full((3,), 1 / 3), torch.tensor([0]))
    assert a[0, 0].item() == pytest.approx(2 / 3) and a[0, 2].item() == pytest.approx(7 / 27)


def _batch(lengths, T=8, n=2):
    mask = torch.zeros(n, T, dtype=torch.long)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, T, dtype=torch.long),
        completion_mask=mask,
        sampling_logprobs=torch.zeros(n, T),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.zeros(n, dtype=torch.long),
        prompts=["p"] * n,
        completions=["c"] * n,
        records=[{}] * n,
    )


def test_brpo_token_advantages_follow_the_cuts():
    # budgets (3, 6); row 0 thinks 5 tokens (closed) then answers to 8; row 1 thinks past 6 (cut at 3 and 6)
    batch = _batch([8, 7])
    batch.extras.update(
        budget_scores=torch.tensor([[1.0, 1.0], [0.0, 1.0]]),
        budget_cuts=torch.tensor([[3, 5], [3, 6]]),
        budget_probs=torch.tensor([[0.5, 0.5], [0.5, 0.5]]),
        think_end=torch.tensor([5, 7]),
        think_closed=torch.tensor([True, False]),
    )
    adv = brpo(batch)
    # segment advantages from the worked example: row 0 (0.25, 0), row 1 (−0.25, 0.25)
    # row 0: tokens 0–2 → 0.25, 3–4 → 0, 5–7 (its answer, the summary at budget 2 ≥ e = 5) → r − group mean at
    #        budget 2 = 1 − 1 = 0
    # row 1: tokens 0–2 → −0.25, 3–5 → 0.25, token 6 (past the last cut) → 0, token 7 padding → 0
    expected = torch.tensor([[0.25, 0.25, 0.25, 0, 0, 0, 0, 0], [-0.25, -0.25, -0.25, 0.25, 0.25, 0.25, 0, 0]])
    assert torch.allclose(adv, expected)
    assert batch.stats["brpo/thinking_adv_abs_mean"] > 0


def test_brpo_summary_advantage_of_the_own_answer():
    # one group of 2, budgets (2, 4): both rows close their thinking at e = 2, so the own answer is the summary at
    # both budgets; scores (1, 1) and (0, 0): group means (0.5, 0.5) → summary advantages +0.5 and −0.5
    batch = _batch([4, 4], T=4)
    batch.extras.update(
        budget_scores=torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
        budget_cuts=torch.tensor([[2, 2], [2, 2]]),
        budget_probs=torch.tensor([[0.5, 0.5], [0.5, 0.5]]),
        think_end=torch.tensor([2, 2]),
        think_closed=torch.tensor([True, True]),
    )
    adv = brpo(batch)
    assert torch.allclose(adv[:, 2:], torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))
    # thinking: segment 0 = tokens 0–1: R_0 = (1, 0), V2 = 0.5 → ±0.5; segment 1 is empty
    assert torch.allclose(adv[:, :2], torch.tensor([[0.5, 0.5], [-0.5, -0.5]]))


def test_brpo_needs_the_stage():
    with pytest.raises(ValueError, match="AnytimeBudgets"):
        brpo(_batch([2, 2]))


class _Tok:
    pad_token_id = 0

    def batch_decode(self, rows, **_):
        names = {5: "</think>", 9: "x"}
        return ["".join(names.get(t, "a") for t in r) for r in rows]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [7, 8]}


class _Rollout:
    """Records the contexts it is asked to continue and answers with a fixed summary per context."""

    def __init__(self):
        self.contexts = []

    def generate_from_ids(self, model, tok, ids, mask, max_new_tokens):
        self.contexts = [ids[r][mask[r].bool()].tolist() for r in range(ids.shape[0])]
        n = ids.shape[0]
        return RolloutOutput(
            ids,
            mask,
            torch.full((n, 2), 9, dtype=torch.long),
            torch.tensor([[1, 1]] * n),
            torch.full((n, 2), -0.5),
            torch.zeros(n, dtype=torch.bool),
            [f"s{r}" for r in range(n)],
        )


def _stage_inputs():
    # row 0: 5 tokens, "</think>" is token 3 → e = 4, then the answer; row 1: 6 tokens, no tag, EOS
    batch = _batch([5, 6])
    batch.completion_ids = torch.tensor([[1, 2, 3, 5, 9, 0, 0, 0], [1, 2, 3, 4, 6, 9, 0, 0]])
    batch.rewards = torch.tensor([[1.0], [0.0]])
    batch.reward_names, batch.reward = ["accuracy"], torch.tensor([1.0, 0.0])
    batch.reward_weights = torch.tensor([1.0])
    batch.reward_failures = torch.zeros(2, 1, dtype=torch.bool)

    def term(samples):  # scores the summary "s<r>" as r / 10
        return TermResult([int(s.completion.split("s")[-1]) / 10 for s in samples])

    policy = torch.nn.Linear(1, 1)
    ctx = SimpleNamespace(rollout=_Rollout(), reward_terms={"accuracy": term}, tokenizer=_Tok(), policy=policy)
    return batch, ctx


def test_stage_truncation_positions_and_scores():
    # budgets (2, 4, 8)
    stage = AnytimeBudgets(budgets=[2, 4, 8], scale=1, prior="uniform", train_summaries=False)
    batch, ctx = _stage_inputs()
    rollout = ctx.rollout
    out = stage(batch, ctx)
    # cuts: row 0 min(b, 4) = (2, 4, 4); row 1 min(b, 6) = (2, 4, 6)
    assert out.extras["budget_cuts"].tolist() == [[2, 4, 4], [2, 4, 6]]
    assert out.extras["think_end"].tolist() == [4, 6] and out.extras["think_closed"].tolist() == [True, False]
    # summarised: (row 0, b=2), (row 1, b=2), (row 1, b=4) → contexts prompt (1, 1) + thinking[:cut] + marker (7, 8)
    assert rollout.contexts == [[1, 1, 1, 2, 7, 8], [1, 1, 1, 2, 7, 8], [1, 1, 1, 2, 3, 4, 7, 8]]
    # scores: row 0: s0 → 0.0, then its own 1.0 at b = 4 and 8; row 1: s1 → 0.1, s2 → 0.2, ended unclosed at b = 8 → 0
    assert torch.allclose(out.extras["budget_scores"], torch.tensor([[0.0, 1.0, 1.0], [0.1, 0.2, 0.0]]))
    assert out.stats["anytime/score_at_budget_1"] == pytest.approx(0.05)
    assert out.stats["anytime/mean_score"] == pytest.approx((0.05 + 0.6 + 0.5) / 3)
    assert out.stats["anytime/summaries"] == 3.0


def test_stage_adds_the_summaries_as_rows_with_their_advantage():
    # as above, with the summaries trained: rows (0, b=2) s0 → 0.0, (1, b=2) s1 → 0.1, (1, b=4) s2 → 0.2, one
    # summary per budget: baseline = the group's mean at that budget: b=2 → (0 + 0.1)/2 = 0.05, b=4 → (1 + 0.2)/2 = 0.6
    stage = AnytimeBudgets(budgets=[2, 4, 8], scale=1, prior="uniform")
    batch, ctx = _stage_inputs()
    out = stage(batch, ctx)
    assert len(out) == 5 and out.extras["anytime_summary"].tolist() == [False, False, True, True, True]
    assert out.extras["replayed"].tolist() == [False, False, True, True, True]  # out of the reward metrics
    assert torch.allclose(out.extras["summary_baseline"][2:], torch.tensor([0.05, 0.05, 0.6]))
    assert out.prompt_ids.shape[1] == 8 and out.prompt_mask[2].sum() == 6  # the contexts, left-padded
    adv = brpo(out)
    # the summary rows: score − baseline on each of their 2 tokens: −0.05, 0.05, −0.4
    assert torch.allclose(adv[2:, :2], torch.tensor([[-0.05, -0.05], [0.05, 0.05], [-0.4, -0.4]]))
    assert torch.all(adv[2:, 2:] == 0)
    # the thinking rows as without them: segment 0 (tokens 0–1), R_0 = (0 + 1 + 1, 0.1 + 0.2 + 0)/3 = (2/3, 0.1)
    assert adv[0, 0].item() == pytest.approx((2 / 3 - 0.1) / 2)


def test_generate_from_ids_continues_the_given_ids(tiny):
    tok = tiny.tokenizer
    ctx = tok(["Hello there", "Hi"], return_tensors="pt", padding=True, add_special_tokens=False)
    for engine in ("loop", "generate"):
        ro = HFRollout(max_new_tokens=8, engine=engine, decode_graph=None)
        torch.manual_seed(0)
        out = ro.generate_from_ids(tiny.model, tok, ctx["input_ids"], ctx["attention_mask"], 3)
        assert out.completion_ids.shape[0] == 2 and out.completion_ids.shape[1] <= 3
        assert torch.equal(out.prompt_ids, ctx["input_ids"]) and len(out.texts) == 2


@pytest.mark.long  # the method's plain two-step run is in test_methods_run; this one checks its mechanism
def test_anytime_reasoner_trains_two_steps(tiny_cfg):
    cfg = tiny_cfg(
        *VARYING,
        "trainer.autocast=off",
        "trainer.max_new_tokens=8",
        "trainer.num_generations=2",
        "algorithm=anytime_reasoner",
        "prompt=tag",
        "algorithm.group_stages.0.summary_tokens=4",
    )
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"])
    for j in range(1, 5):
        assert f"anytime/score_at_budget_{j}" in m
    assert m["anytime/summaries"] > 0  # the tiny model's thinking runs past the budgets: summaries were sampled
    assert m["anytime/mean_score"] > 0  # the vowel-share test reward scores the summaries
    assert m["advantage/abs_mean"] > 0
