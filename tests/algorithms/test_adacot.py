"""AdaCoT: the triggering penalty, the decision-token positions of Selective Loss Masking, and two training steps."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.adaptive_cot import decision_position, selective_loss_mask
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_LOSS_MASK, loss_mask
from rlexp.rewards.adaptive_cot import CotTriggerPenalty, cot_triggered, reasoning_part, trigger_penalty
from rlexp.rewards.terms import Sample
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

# a toy vocabulary: each id decodes to its string
VOCAB = ["<", "think", ">", "</", "think>", "<think>", "\n", " 1", "+1", "=2", "<answer>", "2", "</answer>", "<pad>"]
PAD = 13


class ToyTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(VOCAB[i] for i in ids if not (skip_special_tokens and i == PAD))


def _decode(ids):
    return ToyTokenizer().decode(ids)


def test_cot_triggered_is_a_non_empty_think_block():
    assert cot_triggered("<think> 1+1=2 </think><answer>2</answer>")
    assert not cot_triggered("<think></think><answer>2</answer>")
    assert not cot_triggered("<think>  \n </think><answer>2</answer>")  # blank: no reasoning
    assert not cot_triggered("<answer>2</answer>")  # no block: a direct answer
    assert cot_triggered("  <think>unclosed reasoning")  # cut before the closing tag: it reasons
    assert reasoning_part("<think>a</think>b") == "a"
    assert reasoning_part("x<think>a</think>") is None  # the block must open the response


def test_trigger_penalty_values():
    # α1 (miss) = 0.3, α2 (over) = 0.1
    assert trigger_penalty(True, False, 0.3, 0.1) == -0.1  # reasons without need: −α2
    assert trigger_penalty(False, True, 0.3, 0.1) == -0.3  # needed and skipped: −α1
    assert trigger_penalty(True, True, 0.3, 0.1) == 0.0
    assert trigger_penalty(False, False, 0.3, 0.1) == 0.0


def test_penalty_term_with_and_without_labels():
    def s(text, needs=None):
        rec = {} if needs is None else {"hard": needs}
        return Sample("p", text, rec, 0, 5, False)

    unlabelled = CotTriggerPenalty(alpha_over=0.2)
    out = unlabelled([s("<think>x</think><answer>1</answer>"), s("<think></think><answer>1</answer>")])
    assert out.scores == [-0.2, 0.0]  # every query counts as not needing CoT
    labelled = CotTriggerPenalty(alpha_over=0.2, alpha_miss=0.5, needs_cot_key="hard")
    out = labelled(
        [s("<answer>1</answer>", needs=True), s("<think>x</think>", needs=True), s("<think>x</think>", needs=False)]
    )
    assert out.scores == [-0.5, 0.0, -0.2]
    with pytest.raises(ValueError, match="alpha_over"):
        CotTriggerPenalty(alpha_over=-1.0)


def test_decision_positions_on_hand_built_ids():
    # "<", "think", ">", " 1", ... : the tag spans ids 0..2, the decision is token 3 (" 1": it reasons)
    assert decision_position([0, 1, 2, 7, 8], _decode) == (3, True)
    # "<think>", "</", "think>": the decision is token 1 ("</": it closes the block, no CoT)
    assert decision_position([5, 3, 4, 10], _decode) == (1, True)
    # "<think>", "\n", "\n", " 1": blank tokens after the tag are skipped: the decision is token 3
    assert decision_position([5, 6, 6, 7], _decode) == (3, True)
    # "\n", "<answer>": no block opened, the first token decided
    assert decision_position([6, 10, 11, 12], _decode) == (0, False)
    # the completion ends right after the tag: no decision token
    assert decision_position([5], _decode) == (None, True)


def _batch(rows):
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    n = len(rows)
    return RolloutBatch(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=ids,
        completion_mask=mask,
        sampling_logprobs=torch.zeros(n, T),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.zeros(n, dtype=torch.long),
        prompts=["p"] * n,
        completions=[_decode(r) for r in rows],
        records=[{}] * n,
    )


def test_slm_masks_the_decision_token_in_the_loss_mask():
    rows = [[0, 1, 2, 7, 8, 9], [5, 3, 4, 10, 11, 12], [10, 11, 12]]
    batch = _batch(rows)
    ctx = SimpleNamespace(tokenizer=ToyTokenizer(), step=1)
    out = selective_loss_mask(batch, ctx)
    # masked positions: row 0 at 3, row 1 at 1, row 2 at 0
    expected = torch.tensor([[1, 1, 1, 0, 1, 1], [1, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(loss_mask(out).float(), expected)
    assert out.stats["adacot/masked_tokens"] == 3.0
    assert out.stats["adacot/trigger_rate"] == pytest.approx(1 / 3)  # only row 0 reasons
    assert out.stats["adacot/opened_frac"] == pytest.approx(2 / 3)


def test_slm_acts_only_inside_its_steps():
    batch = _batch([[0, 1, 2, 7]])
    out = selective_loss_mask(batch, SimpleNamespace(tokenizer=ToyTokenizer(), step=5), end_step=4)
    assert TOKEN_LOSS_MASK not in out.extras and out.stats["adacot/masked_tokens"] == 0.0
    assert out.stats["adacot/slm_active"] == 0.0


def test_adacot_trains_two_steps_and_masks_decision_tokens(tiny_cfg):
    cfg = tiny_cfg(
        *VARYING,
        "trainer.autocast=off",
        "trainer.max_new_tokens=6",
        "trainer.num_generations=2",
        "algorithm=adacot",
        "prompt=tag",
    )
    result = run(cfg)
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["loss/total"])
    assert m["adacot/masked_tokens"] > 0  # one decision token per row
    assert 0.0 <= m["adacot/trigger_rate"] <= 1.0


def test_adacot_experiment_composes_penalty_and_slm(tiny_cfg):
    cfg = tiny_cfg("+experiment=adacot", "trainer.autocast=off")
    assert cfg.algorithm.name == "adacot" and cfg.prompt.answer_format == "tag"
    assert cfg.reward.terms.cot_trigger.alpha_over == 0.1
    assert cfg.algorithm.group_stages[0]._target_.endswith("selective_loss_mask")
