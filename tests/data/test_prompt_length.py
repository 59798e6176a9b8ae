"""Prompts longer than the model's context are never generated silently (issue 16): trainer.max_prompt_length
(null: the model's context minus trainer.max_new_tokens) with trainer.overlong_prompts=error (default: one line
naming the row, before anything is generated), truncate (the question's start is cut, the template kept) or drop
(skipped when drawn; the step draws the next prompt instead)."""

import json

import pytest
import torch

from rlexp.config.schema import ConfigError
from rlexp.data.lengths import PromptLimit, model_context
from rlexp.data.prompts import PromptFormat
from rlexp.rollout.hf import HFRollout
from rlexp.runs.training import run

SHORT = [{"question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)} for i in range(8)]
LONG_Q = "Consider the following numbers carefully. " * 40 + "What is 2 + 2?"  # ~300 tokens


def _data(tmp_path, rows):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def generated(monkeypatch):
    """Every prompt the rollout was asked to generate from."""
    seen = []
    original = HFRollout.generate

    def spy(self, model, tokenizer, prompts, *a, **k):
        seen.append(list(prompts))
        return original(self, model, tokenizer, prompts, *a, **k)

    monkeypatch.setattr(HFRollout, "generate", spy)
    return seen


def test_a_100k_token_prompt_is_refused_naming_the_row_before_generating(tiny_cfg, tmp_path, generated):
    huge = {"question": "one two three four five " * 20_000 + "What is 1 + 1?", "answer": "2"}  # ~100k tokens
    path = _data(tmp_path, [*SHORT[:2], huge, *SHORT[2:]])
    cfg = tiny_cfg("dataset=local", f"dataset.path={path}", "dataset.eval_size=2")
    with pytest.raises(ConfigError) as e:
        run(cfg)
    msg = str(e.value)
    assert "\n" not in msg
    head = f"dataset.path={path} row 3 (record 'd-2'): the "
    assert msg.startswith(head) and msg[len(head) :].split(" prompt is ")[0] in ("training", "held-out")
    tokens = int(msg.split(" prompt is ")[1].split(" tokens")[0])
    assert tokens > 100_000
    assert (
        "more than the limit of 2036 tokens (trainer.max_prompt_length=null: the model's context of 2048 tokens "
        "minus trainer.max_new_tokens=12)" in msg
    )
    assert generated == []  # refused before the first rollout


def test_a_set_limit_names_the_key(tiny_cfg, tmp_path, generated):
    path = _data(tmp_path, [*SHORT, {"question": LONG_Q, "answer": "4"}])
    cfg = tiny_cfg("dataset=local", f"dataset.path={path}", "dataset.eval_size=1", "trainer.max_prompt_length=100")
    with pytest.raises(
        ConfigError, match=r"row 9 \(record 'd-8'\): the (training|held-out) prompt is \d+ tokens, more "
    ):
        run(cfg)
    assert generated == []


def test_drop_skips_overlong_prompts_and_keeps_the_step_full(tiny_cfg, tmp_path, generated):
    rows = [*SHORT, *({"question": f"{LONG_Q} ({i})", "answer": "4"} for i in range(4))]
    path = _data(tmp_path, rows)
    cfg = tiny_cfg(
        "dataset=local",
        f"dataset.path={path}",
        "dataset.eval_size=1",
        "trainer.max_prompt_length=100",
        "trainer.overlong_prompts=drop",
        "trainer.max_steps=6",  # 12 prompts drawn from the 11 of the split: past an epoch boundary
    )
    run(cfg)
    assert len(generated) == 6 and all(len(p) == 2 for p in generated)
    assert not any("Consider the following" in p for step in generated for p in step)
    assert all(len(set(step)) == len(step) for step in generated)


def test_truncate_cuts_the_start_of_the_question(tiny_cfg, tmp_path, generated, tiny):
    path = _data(tmp_path, [{"question": LONG_Q, "answer": "4"}] * 1 + SHORT)
    cfg = tiny_cfg(
        "dataset=local",
        f"dataset.path={path}",
        "dataset.eval_size=1",
        "trainer.max_prompt_length=100",
        "trainer.overlong_prompts=truncate",
        "trainer.max_steps=4",
    )
    run(cfg)
    prompts = [p for step in generated for p in step]
    lengths = [len(tiny.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    assert max(lengths) <= 100
    cut = [p for p in prompts if "Consider the following" in p]
    assert cut, "the long question was drawn and trained on, cut"
    assert all("What is 2 + 2?" in p and "You are a careful math assistant" in p for p in cut)
    assert all(p.count("Consider the following") < 40 for p in cut)


def test_a_limit_beyond_the_context_is_refused():
    with pytest.raises(ConfigError) as e:
        PromptLimit.for_run(4096, "error", 2048, 48)
    assert str(e.value) == (
        "trainer.max_prompt_length=4096 does not fit the model's context of 2048 tokens with "
        "trainer.max_new_tokens=48: at most 2000"
    )
    assert PromptLimit.for_run(None, "error", None, 48) is None  # unknown context, no limit set
    assert PromptLimit.for_run(None, "drop", 2048, 48).limit == 2000


def test_drop_leaving_fewer_prompts_than_a_step_is_refused(tiny):
    fmt = PromptFormat(system_prompt="S")
    limit = PromptLimit.for_run(60, "drop", 2048, 12)
    train = [{"id": "a", "question": "1+1?"}, {"id": "b", "question": LONG_Q}, {"id": "c", "question": LONG_Q}]
    with pytest.raises(ConfigError, match=r"^trainer\.prompts_per_step=2 is more than the 1 training prompts within"):
        limit.prepare(tiny.tokenizer, fmt, train, [], prompts_per_step=2)


def test_lengths_are_exact_where_it_matters(tiny):
    tok, fmt = tiny.tokenizer, PromptFormat(system_prompt="Be brief.", instruction="End with '#### <answer>'.")
    questions = ["1+1?", "ünïcödé ✓ " * 30, LONG_Q, "x " * 5]
    exact = [len(tok(fmt.render_full(tok, q), add_special_tokens=False)["input_ids"]) for q in questions]
    for limit in (10, 40, 60, 100, 400):
        got = PromptLimit(limit).lengths(tok, fmt, questions)
        assert [n > limit for n in got] == [n > limit for n in exact], limit
        assert all(g >= e for g, e in zip(got, exact))  # never an underestimate


def test_model_context(tiny):
    assert model_context(tiny.model) == 2048
    assert model_context(torch.nn.Linear(2, 2)) is None
