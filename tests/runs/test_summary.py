"""The end-of-run summary: run directory, tracker run and how to open it, first-vs-last headline metrics,
checkpoints with sizes; the ``outputs/latest`` link; ``rlexp compare`` over a folder holding eval runs."""

import json
import os

import pytest

from rlexp.commands.compare import main as compare_main
from rlexp.runs.setup import link_latest
from rlexp.runs.summary import summarise
from rlexp.runs.training import run


def _write_rows(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_first_and_last_windows_by_hand(tmp_path):
    rows = [{"step": s, "accuracy": s / 10, "length/mean": 40 - s} for s in range(1, 9)]
    # step 8 logged twice (a resume) counts once, the later row
    rows.append({"step": 8, "accuracy": 0.8, "length/mean": 32, "eval/accuracy": 0.5})
    _write_rows(tmp_path / "r", rows)
    s = summarise(tmp_path / "r")
    table = {k: (a, b, w) for k, a, b, w in s.rows}
    assert s.steps == list(range(1, 9))
    assert table["accuracy"] == (pytest.approx(0.15), pytest.approx(0.75), 2)  # window 8 // 4 = 2
    assert table["length/mean"] == (38.5, 32.5, 2)
    first, last, _ = table["eval/accuracy"]  # one evaluation: no "first"
    assert first != first and last == 0.5
    text = s.text()
    assert "| accuracy | 0.15 | 0.75 | +0.6 |" in text and "| eval/accuracy | – | 0.5 | – |" in text
    assert "checkpoints: none kept" in text and "tracker: none" in text


@pytest.mark.long
def test_a_run_prints_and_writes_its_summary(tiny_cfg, tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/mlruns.db"
    run(tiny_cfg("tracker=mlflow", f"tracker.backends.mlflow.tracking_uri={db}"))
    out = capsys.readouterr().out
    text = (tmp_path / "run" / "summary.md").read_text()
    assert text.strip() in out.replace("\r", "")
    assert "- status: FINISHED" in text
    assert f"run directory: `{tmp_path / 'run'}` (2 logged steps, last 2)" in text
    run_id = json.loads((tmp_path / "run" / "tracker_ids.json").read_text())["mlflow"]
    assert f"mlflow: run `{run_id}` in `{db}`; open: `mlflow ui --backend-store-uri {db}" in text
    assert f"/#/experiments/1/runs/{run_id}" in text
    assert f"`{tmp_path / 'run' / 'checkpoints' / 'last'}` (step 2, " in text and " MB on disk" in text
    for key in ("accuracy", "reward/mean", "length/mean", "entropy/mean"):
        assert f"| {key} |" in text


def test_latest_link_points_at_the_newest_run_under_outputs_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = tmp_path / "outputs" / "d" / "a", tmp_path / "outputs" / "d" / "b"
    for d in (a, b):
        d.mkdir(parents=True)
        link_latest(d)
    assert os.readlink(tmp_path / "outputs" / "latest") == "d/b"
    link_latest(tmp_path / "elsewhere")  # a run dir outside ./outputs leaves the link alone
    assert (tmp_path / "outputs" / "latest").resolve() == b


def test_compare_skips_eval_runs_and_links(tmp_path, monkeypatch):
    """``rlexp compare --runs outputs/`` with an ``rlexp eval`` run dir (no algorithm in its config) and the
    ``latest`` link beside the training runs: one run, no traceback."""
    monkeypatch.chdir(tmp_path)
    train = tmp_path / "outputs" / "d" / "t"
    _write_rows(train, [{"step": 1, "accuracy": 0.5}])
    ev = tmp_path / "outputs" / "eval" / "d" / "e"
    _write_rows(ev, [{"step": 0, "eval/x/accuracy": 0.1}])
    (ev / "config.yaml").write_text("model: {name: tiny}\ntrainer: {seed: 0}\neval: {checkpoint: null}\n")
    prov = {"git": {"git_commit": "abc", "git_dirty": "false"}, "hardware": {}, "packages": {}, "start_time": "t"}
    (ev / "provenance.json").write_text(json.dumps(prov))
    link_latest(train)
    paths = compare_main(["--runs", "outputs/", "--metrics", "accuracy"])
    assert str(paths["markdown"]).startswith("outputs/compare/")
    assert "| 1 |" in paths["markdown"].read_text()


def test_a_second_process_on_a_busy_run_dir_stops_before_writing(tiny_cfg, tmp_path):
    """Issue 16: two processes on one run directory logged the same steps twice; now the second stops at once, with
    one line naming the directory, and writes nothing there."""
    import subprocess
    import sys

    from rlexp.config.schema import ConfigError

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from filelock import FileLock; l = FileLock(sys.argv[1]); l.acquire(); print('held', "
            "flush=True); sys.stdin.read()",
            str(run_dir / ".run.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="another process is training in this run directory"):
            run(tiny_cfg())
        assert sorted(p.name for p in run_dir.iterdir()) == [".run.lock"]
    finally:
        holder.communicate("", timeout=30)
    assert run(tiny_cfg()).last_step == 2  # the holder gone, the run goes ahead
