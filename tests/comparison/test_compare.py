"""`rlexp compare` on three runs (two seeds of GRPO, one of Dr. GRPO) in one MLflow store: the
terminal table, the markdown/CSV tables (mean ± std over seeds) and the PNG curves."""

import csv
import statistics

import matplotlib.image
import pytest
from mlflow import MlflowClient

from rlexp.commands.compare import main as compare_main
from rlexp.runs.training import run
from tests.conftest import TINY, compose_train
from tests.test_determinism import FINGERPRINT

RUNS = [("grpo", 0), ("grpo", 1), ("dr_grpo", 0)]


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    for algo, seed in RUNS:
        cfg = compose_train(
            [
                *TINY,
                f"algorithm={algo}",
                f"trainer.seed={seed}",
                "trainer.max_steps=3",
                FINGERPRINT,
                "tracker=mlflow",
                f"tracker.backends.mlflow.tracking_uri={uri}",
                f"tracker.backends.mlflow.artifact_location={root / 'art'}",
            ],
            root / "runs" / f"{algo}-s{seed}",
        )
        run(cfg)
    return root, uri


def final_values(uri, metric):
    """{(algorithm, seed): last value of ``metric``} read straight from MLflow."""
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("rlexp").experiment_id])
    return {(r.data.tags["algorithm"], r.data.tags["seed"]): r.data.metrics[metric] for r in runs}


def read_csv(path):
    with open(path) as f:
        return {row["algorithm"]: row for row in csv.DictReader(f)}


def test_compare_from_mlflow_prints_table_writes_tables_and_curves(three_runs, tmp_path, capsys):
    root, uri = three_runs
    out = tmp_path / "out"
    paths = compare_main(["--tracking-uri", uri, "--experiment", "rlexp", "--out", str(out), "--name", "cmp"])
    printed = capsys.readouterr().out
    assert "3 runs, 2 groups" in printed
    assert "dr_grpo" in printed and "0, 1" in printed and "reward/mean" in printed

    finals = final_values(uri, "reward/mean")
    grpo = [finals[("grpo", "0")], finals[("grpo", "1")]]
    table = read_csv(out / "cmp.csv")
    assert set(table) == {"grpo", "dr_grpo"}
    assert table["grpo"]["n"] == "2" and table["grpo"]["seeds"] == "0 1" and table["dr_grpo"]["n"] == "1"
    assert float(table["grpo"]["reward/mean_mean"]) == pytest.approx(statistics.fmean(grpo))
    assert float(table["grpo"]["reward/mean_std"]) == pytest.approx(statistics.stdev(grpo))
    assert float(table["dr_grpo"]["reward/mean_mean"]) == pytest.approx(finals[("dr_grpo", "0")])
    assert table["dr_grpo"]["reward/mean_std"] == ""  # one seed: no spread
    for col in ("accuracy_mean", "entropy/mean_mean", "length/mean_mean"):
        assert col in table["grpo"]

    md = (out / "cmp.md").read_text()
    cell = f"{statistics.fmean(grpo):.3f} ± {statistics.stdev(grpo):.3f}"
    assert cell in md and cell in printed
    assert "| algorithm | n | seeds | reward/mean |" in md
    with open(out / "cmp_runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 3

    pngs = {p.name for p in paths["png"]}
    assert {"cmp_reward_mean.png", "cmp_accuracy.png", "cmp_entropy_mean.png", "cmp_length_mean.png"} <= pngs
    for name in pngs:
        assert f"![{name[:-4]}]({name})" in md
        img = matplotlib.image.imread(out / name)
        assert img.shape[0] > 200 and img.shape[1] > 300
        assert img[..., :3].std() > 0.01, f"{name} is blank"


def test_compare_filters_by_tag_and_reads_run_dirs(three_runs, tmp_path, capsys):
    root, uri = three_runs
    compare_main(
        [
            "--tracking-uri",
            uri,
            "--tag",
            "algorithm=dr_grpo",
            "--out",
            str(tmp_path / "f"),
            "--metrics",
            "reward/mean,entropy/mean",
        ]
    )
    assert "1 runs, 1 groups" in capsys.readouterr().out
    with open(tmp_path / "f" / "compare_runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["algorithm"] for r in rows] == ["dr_grpo"]
    assert set(rows[0]) >= {"reward/mean", "entropy/mean"} and "accuracy" not in rows[0]

    # run directories (metrics.jsonl) give the same table as MLflow
    compare_main(["--runs", str(root / "runs"), "--out", str(tmp_path / "local")])
    compare_main(["--tracking-uri", uri, "--out", str(tmp_path / "ml")])
    local, ml = read_csv(tmp_path / "local" / "compare.csv"), read_csv(tmp_path / "ml" / "compare.csv")
    assert set(local) == set(ml)
    for algo in ml:
        for col in ("n", "seeds", "reward/mean_mean", "reward/mean_std", "entropy/mean_mean"):
            a, b = local[algo][col], ml[algo][col]
            assert a == b or float(a) == pytest.approx(float(b), rel=1e-6), (algo, col, a, b)


def test_compare_without_runs_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no runs"):
        compare_main(["--tracking-uri", f"sqlite:///{tmp_path / 'empty.db'}", "--out", str(tmp_path / "o")])
