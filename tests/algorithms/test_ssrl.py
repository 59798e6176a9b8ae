"""SSRL's information mask (issue 28): the tokens of each self-written <information> block out of the loss, found
on the completion's own tokens; a two-step run with self-search completions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlexp.algorithms.group_stages.self_search import InformationMask, information_spans, masked_positions
from rlexp.core.batch import RolloutBatch
from rlexp.core.masks import TOKEN_LOSS_MASK, loss_mask
from rlexp.runs.training import run

TEXT = "<think>a</think><search>q</search>\n<information>Orla was born in 1873.</information>\n<answer>1873</answer>"


def test_information_spans():
    start = TEXT.index("<information>")
    end = TEXT.index("</information>") + len("</information>")
    assert information_spans(TEXT) == [(start, end)]
    assert information_spans("<information>a\nb</information>x<information>c") == [(0, 30), (31, 45)]
    assert information_spans("<think>x</think><answer>y</answer>") == []


def test_masked_tokens_are_exactly_the_information_block(tiny):
    tok = tiny.tokenizer
    ids = tok(TEXT, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    positions, text = masked_positions(tok, ids)
    assert text == TEXT
    assert positions == list(range(positions[0], positions[-1] + 1))  # one contiguous run
    inside = tok.decode(ids[positions[0] : positions[-1] + 1])
    assert inside == "<information>Orla was born in 1873.</information>"  # the block's tokens, tags included
    assert "information" not in tok.decode(ids[: positions[0]]) + tok.decode(ids[positions[-1] + 1 :])
    # SmolLM2 merges "><" into one token: a token that straddles the block's edge overlaps it, so it is masked
    tight = "<search>q</search><information>x y</information><answer>1</answer>"
    ids = tok(tight, add_special_tokens=False)["input_ids"]
    positions, _ = masked_positions(tok, ids)
    assert tok.decode(ids[positions[0] : positions[-1] + 1]) == "><information>x y</information><"


def batch_of(tok, texts: list[str]) -> RolloutBatch:
    rows = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(len(r) for r in rows)
    n = len(rows)
    comp = torch.full((n, width), tok.pad_token_id)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, r in enumerate(rows):
        comp[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutBatch(
        torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long), comp, mask, torch.zeros(n, width),
        torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long), [""] * n, texts, [{}] * n,
    )  # fmt: skip


def test_the_stage_takes_the_blocks_out_of_the_loss_only(tiny):
    tok = tiny.tokenizer
    cut = "<think>a</think><search>q</search>\n<information>Orla was"  # cut by the token limit: masked to the end
    batch = batch_of(tok, [TEXT, "<think>a</think><answer>1</answer>", cut])
    ctx = SimpleNamespace(tokenizer=tok)
    out = InformationMask()(batch, ctx)
    weights = out.extras[TOKEN_LOSS_MASK]
    n_text = len(tok(TEXT, add_special_tokens=False)["input_ids"]) + 1
    n_block = len(masked_positions(tok, out.completion_ids[0, :n_text].tolist())[0])
    assert weights[0].sum().item() == weights.shape[1] - n_block and weights[1].min().item() == 1.0
    keep = loss_mask(out)
    assert keep[0].sum().item() == n_text - n_block  # the block's tokens are out of the loss ...
    assert out.completion_mask[0].sum().item() == n_text  # ... not out of the completion
    n_cut = len(tok(cut, add_special_tokens=False)["input_ids"])
    block = n_cut - len(tok("<think>a</think><search>q</search>\n", add_special_tokens=False)["input_ids"])
    assert keep[2].sum().item() == n_cut + 1 - block  # the open block to the end; the EOS stays
    total = int(out.completion_mask.sum())
    assert out.stats["ssrl/masked_frac"] == pytest.approx((n_block + block) / total)
    assert out.stats["ssrl/searches"] == pytest.approx(2 / 3) and out.stats["ssrl/information_rows_frac"] == 2 / 3
    measured = InformationMask(mask=False)(batch_of(tok, [TEXT]), ctx)
    assert TOKEN_LOSS_MASK not in measured.extras and measured.stats["ssrl/masked_frac"] > 0


# what a two-step SSRL run on the tiny model needs for its mechanism to act (test_methods_run adds these to its varying
# reward; this file's run uses reward=ssrl): completions with self-written <information> blocks
SELF_SEARCH_RUN = ["prompt=self_search", "rollout._target_=tests.tools.search_engines.SelfSearchEngine"]


@pytest.mark.long  # ~15 s quiet: two GRPO steps of 8 scripted completions, half of them self-search
def test_ssrl_trains_two_steps_and_masks_the_self_written_information(tiny_cfg, tmp_path):
    result = run(
        tiny_cfg(
            "algorithm=ssrl",
            "reward=ssrl",
            "dataset=search_facts",
            f"dataset.cache_dir={tmp_path / 'cache'}",
            "trainer.autocast=off",
            *SELF_SEARCH_RUN,
        )
    )
    m = result.metrics
    assert result.last_step == 2 and math.isfinite(m["loss/total"]) and math.isfinite(m["grad_norm"])
    assert 0.0 < m["ssrl/masked_frac"] < 1.0 and m["ssrl/information_rows_frac"] == 0.5
    assert m["ssrl/searches"] >= 0.5
    assert m["reward/format/mean"] == pytest.approx(0.75)  # the self-search half scores 1, think-answer 1/2
    assert m["advantage/abs_mean"] > 0.0
