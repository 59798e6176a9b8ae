"""Bad input fails at start with one clear message naming the key or row."""

import json
import subprocess
import sys

import pytest

from rlexp.config.schema import ConfigError, validate
from rlexp.runs.training import run


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.num_generations=1", "trainer.num_generations"),
        ("optimizer.lr=0", "optimizer.lr"),
        ("optimizer.lr=-1e-5", "optimizer.lr"),
        ("trainer.max_new_tokens=0", "trainer.max_new_tokens"),
        ("trainer.temperature=0", "trainer.temperature"),
        ("trainer.micro_batch_tokens=0", "trainer.micro_batch_tokens"),
        ("trainer.accuracy_term=nope", "trainer.accuracy_term"),
        ("trainer.compile=true trainer.compile_backend=inductr", "trainer.compile_backend"),
        ("trainer.compile=true trainer.compile_mode=fast", "trainer.compile_mode"),
    ],
)
def test_invalid_values_name_the_key(tiny_cfg, override, key):
    cfg = tiny_cfg(*override.split())
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(cfg)


def test_type_error_at_compose_names_the_key(tiny_cfg):
    with pytest.raises(Exception, match="max_steps"):
        tiny_cfg("trainer.max_steps=many")


def test_unknown_trainer_key_is_rejected(tiny_cfg):
    with pytest.raises(Exception, match="not_a_setting"):
        tiny_cfg("trainer.not_a_setting=1")


def test_unknown_group_option_lists_valid_ones():
    out = subprocess.run(
        [sys.executable, "-m", "rlexp.commands.train", "algorithm=not_a_method", "--cfg", "job"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "not_a_method" in out.stderr and "Available options" in out.stderr and "grpo" in out.stderr


def test_missing_dataset_column_names_column_and_row(tiny_cfg, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n" + json.dumps({"question": "2+2"}) + "\n")
    cfg = tiny_cfg("dataset=local", f"dataset.path={data}", "dataset.eval_size=1")
    with pytest.raises(ValueError, match=r"row 2 has no column 'answer'"):
        run(cfg)


def test_malformed_jsonl_row_names_line_number(tiny_cfg, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": \n')
    cfg = tiny_cfg("dataset=local", f"dataset.path={data}", "dataset.eval_size=1")
    with pytest.raises(ValueError, match=r"line 2 is not valid JSON"):
        run(cfg)


def test_bad_algorithm_setting_names_the_key(tiny_cfg):
    cfg = tiny_cfg("algorithm.aggregation=bogus")
    with pytest.raises(ValueError, match="algorithm.aggregation"):
        run(cfg)
