"""``rlexp train stage=sft`` on the tiny model (``rlexp.runs.training.run``, the CLI's path): TRL's SFTTrainer in our
run, logging our metric names, evaluating at its start and end, saving the model a next stage loads."""

import json
import math
from pathlib import Path

import pytest
import torch

from rlexp.config.schema import ConfigError, validate
from rlexp.runs.training import run
from tests.algorithms.varying_reward import VARYING

FAST = ["trainer.autocast=off", "trainer.max_new_tokens=8"]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_stage_sft_composes_the_sft_node_and_leaves_the_default_alone(tiny_cfg):
    cfg = tiny_cfg("stage=sft")
    assert cfg.algorithm.name == "sft" and cfg.algorithm.backend == "sft" and "advantage" not in cfg.algorithm
    assert cfg.run_name.startswith("sft-")
    validate(cfg)
    default = tiny_cfg()
    assert default.algorithm.name == "grpo" and "stage" not in default and default.pipeline is None


def test_stage_sft_with_an_rl_method_is_refused_naming_the_key(tiny_cfg):
    with pytest.raises(ConfigError, match=r"^algorithm\.trainer is not a setting of the SFT stage"):
        validate(tiny_cfg("stage=sft", "algorithm=dpo"))


def test_sft_two_steps_logs_our_metrics_and_saves_the_model(tiny_cfg, tiny):
    cfg = tiny_cfg(*FAST, "stage=sft", "eval.size=4")
    result = run(cfg)
    run_dir = Path(cfg.trainer.run_dir)
    m = result.metrics
    assert result.last_step == 2
    assert math.isfinite(m["sft/loss"]) and m["sft/loss"] > 0 and m["loss/total"] == m["sft/loss"]
    assert 0 <= m["sft/token_accuracy"] <= 1 and m["grad_norm"] > 0 and m["lr"] == pytest.approx(1e-5)
    # every training record of the default task has a demonstration (metadata.expression)
    assert m["sft/examples"] == 64 and m["sft/skipped"] == 0
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "sft/loss" in rows[1]
    assert json.loads((run_dir / "provenance.json").read_text())["status"] == "FINISHED"
    # the model a following stage loads: weights, config and tokenizer, trained away from the initial weights
    saved = run_dir / "model"
    assert (saved / "config.json").exists() and (saved / "tokenizer.json").exists()
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(saved)
    before = dict(tiny.model.named_parameters())
    moved = [n for n, p in trained.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "the saved weights are the initial ones"
    assert "sft/loss" in (run_dir / "summary.md").read_text()


@pytest.mark.long  # a tiny training run: the default suite keeps to ten minutes
def test_sft_on_own_correct_samples(tiny_cfg):
    """Re-distillation's data on the tiny model: its own completions, the vowel share standing in for correctness
    (``min_score`` 0.3); the kept examples are cached in the run directory."""
    cfg = tiny_cfg(
        *FAST,
        *VARYING,
        "stage=sft",
        "algorithm.data=own_samples",
        "algorithm.num_prompts=6",
        "algorithm.samples_per_prompt=3",
        "algorithm.prompts_per_call=3",
        "algorithm.min_score=0.3",
    )
    m = run(cfg).metrics
    run_dir = Path(cfg.trainer.run_dir)
    cached = [json.loads(line) for line in (run_dir / "sft_examples.jsonl").read_text().splitlines()]
    assert m["sft/sampled"] == 18 and 0 < m["sft/correct_frac"] <= 1
    assert len(cached) == m["sft/examples"] == m["sft/prompts_with_correct"] > 0  # one per prompt at most
    assert all(r["score"] >= 0.3 for r in cached)
