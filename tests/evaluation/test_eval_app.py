"""`rlexp eval` end to end on the tiny model (its outputs are noise; what is tested is that the
numbers logged to MLflow, the summary and the per-problem JSONL agree with each other)."""

import json

import pytest

from rlexp.evaluation.metrics import pass_at_k
from rlexp.runs.evaluation import resolve_checkpoint, run_eval
from tests.conftest import compose_train

TINY_EVAL = ["model=tiny", "trainer.max_new_tokens=12", "eval.bootstrap=50"]


@pytest.fixture(autouse=True)
def local_mlflow(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def mlflow_metrics(run_dir):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlruns.db")
    exp = client.get_experiment_by_name("rlexp")
    (run,) = client.search_runs([exp.experiment_id])
    return client, run


@pytest.mark.long
def test_offline_suite_logs_pass_maj_consistency_length_to_mlflow(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_train(
        [*TINY_EVAL, "benchmark=offline", "eval.n=4", "eval.limit=3", "tracker=mlflow"], run_dir, "eval"
    )
    result = run_eval(cfg)
    m = result.metrics
    names = ["rg_basic_arithmetic", "rg_chain_sum", "rg_gsm_symbolic"]
    for b in names:
        for key in [
            "pass_at_1",
            "pass_at_2",
            "pass_at_3",
            "pass_at_4",
            "maj_at_4",
            "accuracy",
            "pass_at_1_ci_low",
            "pass_at_1_ci_high",
            "length/mean",
            "length/median",
            "length/truncated_frac",
            "consistency/rederive_rate",
            "consistency/likelihood_rate",
            "consistency/no_answer_frac",
        ]:
            assert f"eval/{b}/{key}" in m, (b, key)
        # the per-problem file agrees with the logged numbers
        rows = [json.loads(l) for l in (run_dir / "eval" / f"{b}.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and all(len(r["samples"]) == 4 for r in rows)
        for r in rows:
            assert r["num_correct"] == sum(s["correct"] for s in r["samples"])
            assert set(r["samples"][0]) >= {"completion", "answer", "correct", "num_tokens", "truncated", "consistency"}
        for k in range(1, 5):
            expected = sum(pass_at_k(4, r["num_correct"], k) for r in rows) / 3
            assert m[f"eval/{b}/pass_at_{k}"] == pytest.approx(expected)
        lengths = [s["num_tokens"] for r in rows for s in r["samples"]]
        assert m[f"eval/{b}/length/mean"] == pytest.approx(sum(lengths) / len(lengths))
        no_answer = [s["consistency"]["stated"] is None for r in rows for s in r["samples"]]
        assert m[f"eval/{b}/consistency/no_answer_frac"] == pytest.approx(sum(no_answer) / len(no_answer))
    assert m["eval/mean/accuracy"] == pytest.approx(sum(m[f"eval/{b}/accuracy"] for b in names) / 3)
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["step"] == 0 and summary["metrics"].keys() == m.keys()
    client, run = mlflow_metrics(run_dir)
    logged = run.data.metrics
    for key in (
        "eval/rg_chain_sum/pass_at_4",
        "eval/rg_chain_sum/maj_at_4",
        "eval/rg_chain_sum/consistency/rederive_rate",
        "eval/rg_chain_sum/length/mean",
    ):
        assert logged[key] == pytest.approx(m[key])
    assert not any("@" in k for k in logged)
    assert run.data.tags["kind"] == "eval" and run.info.status == "FINISHED"
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "eval")}
    assert "eval/summary.json" in arts and "eval/rg_chain_sum.jsonl" in arts


def test_humaneval_executes_generated_code(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_train(
        [
            *TINY_EVAL,
            "benchmark=humaneval",
            "eval.n=2",
            "eval.limit=2",
            "tracker=none",
            "benchmark.humaneval.checker.timeout=3",
            "eval.max_new_tokens=12",
        ],
        run_dir,
        "eval",
    )
    m = run_eval(cfg).metrics
    rows = [json.loads(l) for l in (run_dir / "eval" / "humaneval.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["HumanEval/0", "HumanEval/1"]
    for s in (s for r in rows for s in r["samples"]):
        assert s["execution"].split(":")[0] in ("passed", "failed", "timed out")
        assert s["correct"] == (s["execution"] == "passed")
    assert "eval/humaneval/pass_at_2" in m and "eval/humaneval/maj_at_2" not in m
    assert not any("consistency" in k for k in m)  # code has no final answer to re-derive


@pytest.mark.long
def test_checkpoint_of_a_training_run_is_evaluated_at_its_step(tmp_path, tiny_cfg):
    from rlexp.runs.training import run

    train_cfg = tiny_cfg("trainer.max_steps=1", "trainer.checkpoint_every=1")
    run(train_cfg)
    train_dir = tmp_path / "run"
    model_dir, step = resolve_checkpoint(str(train_dir))
    assert model_dir == train_dir / "checkpoints" / "last" / "model" and step == 1
    eval_dir = tmp_path / "eval"
    cfg = compose_train(
        [
            *TINY_EVAL,
            "benchmark=rg_basic_arithmetic",
            "eval.n=2",
            "eval.limit=2",
            "tracker=none",
            f"eval.checkpoint={train_dir}",
        ],
        eval_dir,
        "eval",
    )
    run_eval(cfg)
    (row,) = [json.loads(l) for l in (eval_dir / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and "eval/rg_basic_arithmetic/pass_at_2" in row
    with pytest.raises(FileNotFoundError, match="eval.checkpoint"):
        resolve_checkpoint(str(tmp_path / "nowhere"))


def test_errors_name_the_key(tmp_path):
    cfg = compose_train([*TINY_EVAL, "benchmark=rg_chain_sum", "eval.n=0", "tracker=none"], tmp_path / "r", "eval")
    with pytest.raises(ValueError, match="eval.n=0"):
        run_eval(cfg)
    cfg = compose_train(
        [*TINY_EVAL, "benchmark=rg_chain_sum", "eval.maj_tie=coin", "tracker=none"], tmp_path / "r3", "eval"
    )
    with pytest.raises(ValueError, match="eval.maj_tie"):
        run_eval(cfg)
    cfg = compose_train(
        [*TINY_EVAL, "benchmark=rg_chain_sum", "consistency.judge=oracle", "tracker=none"], tmp_path / "r2", "eval"
    )
    with pytest.raises(ValueError, match="consistency.judge"):
        run_eval(cfg)


def test_option_shuffle_rate_in_eval_output_and_mlflow(tmp_path):
    """A multiple-choice benchmark (GPQA-Diamond, local file in its schema) with consistency.shuffle=true: the
    shuffle rate is in the metrics, the summary, MLflow and each sample's consistency record."""
    from tests.evaluation.test_benchmarks import FIX

    run_dir = tmp_path / "run"
    cfg = compose_train(
        [
            *TINY_EVAL,
            "benchmark=gpqa_diamond",
            f"benchmark.gpqa_diamond.source.data_files={FIX / 'gpqa_diamond.csv'}",
            "benchmark.gpqa_diamond.max_new_tokens=12",
            "eval.n=2",
            "consistency.shuffle=true",
            "tracker=mlflow",
        ],
        run_dir,
        "eval",
    )
    m = run_eval(cfg).metrics
    key = "eval/gpqa_diamond/consistency/shuffle_rate"
    assert 0.0 <= m[key] <= 1.0 and m["eval/gpqa_diamond/consistency/shuffle_measured"] == 4.0
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["metrics"][key] == m[key]
    _, run = mlflow_metrics(run_dir)
    assert run.data.metrics[key] == pytest.approx(m[key])
    rows = [json.loads(l) for l in (run_dir / "eval" / "gpqa_diamond.jsonl").read_text().splitlines()]
    assert all("shuffle_consistent" in s["consistency"] for r in rows for s in r["samples"])
