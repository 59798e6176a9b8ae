"""The MLflow UI shows logged runs: a real `mlflow server` on loopback, two runs logged through the
rlexp MLflow tracker, the UI opened in headless Chromium. The compare-runs page's DOM must list both
runs with their metric values; screenshots of it and of the chart view are kept under the test's
tmp dir (and copied to $RLEXP_SCREENSHOT_DIR when set, e.g. results/screenshots)."""

import os
import re
import shutil
import subprocess

import pytest

from rlexp.tracking.mlflow_tracker import MLflowTracker

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install -y chromium)")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
]

CURVES = {  # two runs with distinct learning curves
    "grpo-demo-s0": {"accuracy": [0.1, 0.25, 0.4], "entropy/mean": [2.5, 2.25, 1.875], "reward/mean": [0.2, 0.3, 0.45]},
    "grpo-demo-s1": {
        "accuracy": [0.2, 0.35, 0.625],
        "entropy/mean": [2.75, 2.5, 2.125],
        "reward/mean": [0.1, 0.4, 0.7],
    },
}


def format_metric(v: float) -> str:
    """The MLflow UI's number format (Utils.formatMetric): 3 decimals below 10, 2 below 100."""
    if v == 0:
        return "0"
    r = round(v, 3) if abs(v) < 10 else round(v, 2)
    return f"{r:g}"


def chromium(url: str, user_data_dir, *args: str, budget_ms: int = 20000) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={user_data_dir}", f"--virtual-time-budget={budget_ms}", *args, url],
        capture_output=True,
        text=True,
        timeout=180,
    )


def visible_text(html: str) -> str:
    html = re.sub(r"<script.*?</script>|<style.*?</style>", " ", html, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


@pytest.mark.long
def test_mlflow_ui_shows_both_runs_and_their_metrics(mlflow_server, tmp_path):
    run_ids = {}
    for name, curves in CURVES.items():
        tracker = MLflowTracker(mlflow_server.url, experiment="dashboard")
        seed = name[-1]
        run_ids[name] = tracker.start(
            name,
            {},
            {"algorithm.name": "grpo", "trainer.seed": seed},
            {"algorithm": "grpo", "seed": seed, "mlflow.runName": name},
        )
        for step in range(3):
            tracker.log_metrics({k: v[step] for k, v in curves.items()}, step + 1)
        tracker.finish("FINISHED")
        assert tracker.pending() == 0
    exp_id = tracker.client.get_experiment_by_name("dashboard").experiment_id
    ids = ",".join(f'"{i}"' for i in run_ids.values())
    compare_url = f'{mlflow_server.url}/#/compare-runs?runs=[{ids}]&experiments=["{exp_id}"]'

    text = ""
    for budget in (20000, 60000):  # a loaded machine may need longer for the React app to fetch the runs
        # a wide window: the UI's tables render only the columns in view
        res = chromium(
            compare_url, tmp_path / f"profile-dom-{budget}", "--dump-dom", "--window-size=1600,2000", budget_ms=budget
        )
        text = visible_text(res.stdout)
        if all(i in text for i in run_ids.values()) and "Metrics Show diff only" in text:
            break
    (tmp_path / "compare-runs.txt").write_text(text)
    assert "Comparing 2 Runs" in text, text[:2000]
    for name, run_id in run_ids.items():
        assert name in text and run_id in text, name
    metrics_part = text[text.index("Metrics Show diff only") :]  # the metrics table (name column, then one per run)
    metrics_part = metrics_part[: metrics_part.find("Artifacts")]
    for key in ("accuracy", "entropy/mean"):
        assert key in metrics_part
        for name, curves in CURVES.items():
            assert format_metric(curves[key][-1]) in metrics_part, (name, key, format_metric(curves[key][-1]))

    shots = {
        "mlflow_compare_runs.png": (compare_url, "1400,1800"),
        "mlflow_run_charts.png": (
            f"{mlflow_server.url}/#/experiments/{exp_id}/runs?compareRunsMode=CHART",
            "1600,1100",
        ),
    }
    for file, (url, size) in shots.items():
        res = chromium(
            url,
            tmp_path / f"profile-{file}",
            f"--screenshot={tmp_path / file}",
            f"--window-size={size}",
            budget_ms=60000,
        )  # the charts load lazily
        assert (tmp_path / file).exists() and (tmp_path / file).stat().st_size > 20_000, res.stderr[-2000:]
    if os.environ.get("RLEXP_SCREENSHOT_DIR"):
        dest = os.environ["RLEXP_SCREENSHOT_DIR"]
        os.makedirs(dest, exist_ok=True)
        for file in shots:
            shutil.copy(tmp_path / file, dest)
