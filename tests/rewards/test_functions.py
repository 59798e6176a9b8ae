"""Plain functions as reward terms: TRL's reward-function convention (its docs' ``reward_len`` and its shipped
``trl.rewards.accuracy_reward``), one-sample functions, and a module in the working directory from the console
script."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.rewards.functions import FunctionReward
from rlexp.rewards.terms import Sample
from rlexp.runs.setup import build_reward_term


def reward_len(completions, **kwargs):
    """TRL's docs (GRPOTrainer, "Using a custom reward function"): reward completions close to 20 characters."""
    return [-abs(20 - len(completion)) for completion in completions]


def needs_answer(completions, answer, **kwargs):
    return [None if a is None else float(c.strip().endswith(a)) for c, a in zip(completions, answer, strict=True)]


def one_sample(sample: Sample) -> float:
    return float(sample.num_tokens)


def broken(completions, **kwargs):
    raise RuntimeError("judge down")


def _samples(completions, answers=("3", "3"), ids=None):
    return [
        Sample(f"q{i}", c, {"question": f"q{i}", "answer": a}, 0, len(c.split()), False, ids)
        for i, (c, a) in enumerate(zip(completions, answers, strict=True))
    ]


def test_trl_docs_reward_len_as_a_config_term():
    node = OmegaConf.create({"_target_": f"{__name__}.reward_len", "weight": 0.5})
    term = build_reward_term(node, "reward.terms.length")
    assert isinstance(term, FunctionReward) and term.weight == 0.5
    res = term(_samples(["x" * 20, "x" * 25]))
    assert res.scores == [0.0, -5.0] and res.failures == [False, False]


def test_trl_accuracy_reward_unchanged_with_conversational_completions_and_a_renamed_column():
    """``trl.rewards.accuracy_reward(completions, solution, **kwargs)`` reads ``completion[0]["content"]`` and
    TRL's ``solution`` column: conversational format, our ``answer`` handed over as ``solution``."""
    pytest.importorskip("math_verify")
    node = OmegaConf.create(
        {
            "_target_": "trl.rewards.accuracy_reward",
            "completion_format": "conversational",
            "columns": {"solution": "answer"},
        }
    )
    term = build_reward_term(node, "reward.terms.trl_accuracy")
    res = term(_samples([r"so \boxed{\frac{1}{3}}", r"so \boxed{\frac{1}{2}}"], answers=(r"\frac{1}{3}",) * 2))
    assert res.scores == [1.0, 0.0] and res.failures == [False, False]


def test_record_columns_arrive_as_lists_and_none_scores_zero():
    term = FunctionReward(needs_answer)
    samples = _samples(["it is 3", "it is 4"]) + [Sample("q", "x", {"question": "q", "answer": None}, 1, 1, False)]
    assert term(samples).scores == [1.0, 0.0, 0.0]


def test_completion_ids_are_passed_when_known():
    seen = {}

    def spy(completions, completion_ids, **kw):
        seen["ids"] = completion_ids
        return [0.0] * len(completions)

    FunctionReward(spy)(_samples(["a", "b"], ids=[5, 6]))
    assert seen["ids"] == [[5, 6], [5, 6]]


def test_one_sample_function_is_called_per_sample():
    term = build_reward_term(OmegaConf.create({"_target_": f"{__name__}.one_sample"}), "reward.terms.n")
    assert term.per_sample and term(_samples(["a b c", "a"])).scores == [3.0, 1.0]


def one_short(completions, **kwargs):
    return [0.0]


def test_a_failing_function_records_failures_and_a_wrong_count_names_the_function():
    res = FunctionReward(broken)(_samples(["a", "b"]))
    assert res.scores == [0.0, 0.0] and res.failures == [True, True]
    with pytest.raises(ValueError, match="one_short returned 1 rewards for 2 completions"):
        FunctionReward(one_short)(_samples(["a", "b"]))


def test_an_unimportable_target_names_the_key():
    with pytest.raises(ConfigError, match=r"reward.terms.mine._target_='no_such_module.fn' cannot be imported"):
        build_reward_term(OmegaConf.create({"_target_": "no_such_module.fn"}), "reward.terms.mine")


@pytest.mark.long  # a default-suite budget of 10 minutes (CI runs the long suite too)
def test_console_script_imports_a_reward_module_from_the_working_directory(tmp_path):
    """``rlexp train`` (the console script, not ``python -m``) finds ``my_rewards.py`` beside the user."""
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def reward_len(completions, **kwargs):
                return [-abs(20 - len(completion)) for completion in completions]
            """
        )
    )
    rlexp = Path(sys.executable).parent / "rlexp"
    cmd = [
        str(rlexp),
        "train",
        "model=tiny",
        "trainer.max_steps=1",
        "trainer.prompts_per_step=2",
        "trainer.num_generations=2",
        "trainer.max_new_tokens=8",
        "tracker=none",
        "eval.size=0",
        "trainer.checkpoint_every=0",
        "+reward.terms.length._target_=my_rewards.reward_len",
        "+reward.terms.length.weight=0.01",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["reward/length/failures"] == 0 and row["reward/length/mean"] <= 0
