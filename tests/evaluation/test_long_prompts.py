"""`rlexp eval` refuses, before generating, a benchmark problem whose prompt leaves no room for the new tokens in
the model's context, naming the benchmark and the problem (issue 16)."""

import json

import pytest

from rlexp.config.schema import ConfigError
from rlexp.rollout.hf import HFRollout
from rlexp.runs.evaluation import run_eval
from tests.conftest import compose_train


def test_a_100k_token_problem_is_refused_before_generating(tmp_path, monkeypatch):
    rows = [
        {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"},
        {"question": "one two three four five " * 20_000 + "What is 2 + 2?", "answer": "#### 4"},
    ]
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def no_generate(*a, **k):
        raise AssertionError("generated")

    monkeypatch.setattr(HFRollout, "generate", no_generate)
    cfg = compose_train(
        ["model=tiny", "tracker=none", "benchmark=gsm8k", f"benchmark.gsm8k.source.data_files={data}", "eval.n=1"],
        tmp_path / "run",
        "eval",
    )
    with pytest.raises(ConfigError) as e:
        run_eval(cfg)
    msg = str(e.value)
    assert msg.startswith("benchmark.gsm8k problem ") and "\n" not in msg
    assert "more than the model's context of 2048 tokens minus 512 new tokens (1 of 2 problems are;" in msg
    assert int(msg.split("its prompt is ")[1].split(" tokens")[0]) > 100_000
