"""Held-out evaluation of the untrained policy (trainer.eval_at_start, issue 30): logged at step 0, once across a
resume; eval/accuracy_gain at later evaluations; the summary's "held-out accuracy before -> after" line."""

import json

import pytest

from rlexp.runs.summary import summarise
from rlexp.runs.training import run


def rows(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


EVAL = ("eval.size=6", "trainer.eval_every=2", "trainer.max_steps=2")


def test_the_untrained_policy_is_evaluated_at_step_0_and_the_gain_is_logged(tiny_cfg, tmp_path):
    run(tiny_cfg(*EVAL))
    logged = rows(tmp_path / "run")
    assert [r["step"] for r in logged] == [0, 1, 2]
    start, end = logged[0], logged[2]
    assert set(start) == {"step", "time", "eval/accuracy", "eval/length/mean", "eval/length/truncated_frac"}
    assert "eval/accuracy" not in logged[1]
    assert end["eval/accuracy_gain"] == pytest.approx(end["eval/accuracy"] - start["eval/accuracy"])


def test_eval_at_start_false_evaluates_only_later(tiny_cfg, tmp_path):
    run(tiny_cfg(*EVAL, "trainer.eval_at_start=false"))
    logged = rows(tmp_path / "run")
    assert [r["step"] for r in logged] == [1, 2]
    assert "eval/accuracy" in logged[1] and "eval/accuracy_gain" not in logged[1]


def test_no_step_0_without_held_out_evaluation(tiny_cfg, tmp_path):
    run(tiny_cfg("eval.size=0", "trainer.max_steps=1"))
    assert [r["step"] for r in rows(tmp_path / "run")] == [1]


@pytest.mark.long
def test_a_resumed_run_does_not_evaluate_step_0_again_and_keeps_the_gain(tiny_cfg, tmp_path):
    run(tiny_cfg(*EVAL, "trainer.checkpoint_every=1"))
    run(tiny_cfg("eval.size=6", "trainer.eval_every=2", "trainer.max_steps=3", "trainer.checkpoint_every=1"))
    logged = rows(tmp_path / "run")
    assert [r["step"] for r in logged] == [0, 1, 2, 3]
    assert logged[3]["eval/accuracy_gain"] == pytest.approx(logged[3]["eval/accuracy"] - logged[0]["eval/accuracy"])


def test_the_summary_states_held_out_accuracy_before_and_after(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    data = [
        {"step": 0, "eval/accuracy": 0.12},
        {"step": 1, "accuracy": 0.1},
        {"step": 2, "accuracy": 0.2, "eval/accuracy": 0.2},
        {"step": 3, "accuracy": 0.3, "eval/accuracy": 0.35},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    s = summarise(run_dir)
    assert s.held_out == (0.12, 0, 0.35, 3)
    assert "- held-out accuracy (greedy): 0.120 at step 0 → 0.350 at step 3" in s.text()
    table = {k: (a, b) for k, a, b, _ in s.rows}
    assert table["eval/accuracy"] == (0.12, 0.35)
