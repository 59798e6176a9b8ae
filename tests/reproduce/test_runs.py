"""The runs of an experiment without training: the config hash (what it drops), finding finished runs, refusing a
changed one, the table built from the runs' metrics.jsonl, and the command launching only what is missing. The runs
are written by hand here (config.yaml and provenance.json as the trainer writes them, metrics.jsonl made up);
test_end_to_end.py trains them."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.commands import reproduce as command
from rlexp.reproduce import runs as runs_module
from rlexp.reproduce.runs import CHANGED, FINISHED, LAUNCH, RESUME, compose_run, config_hash, plan_runs, saved_hash
from rlexp.reproduce.spec import SpecError, load_spec
from rlexp.tracking.provenance import collect_provenance, finish_provenance, save_provenance

DEMO = "reproduce_tiny_demo"
# made-up metrics per run: length/mean at steps 1, 2 (the demo averages the last 2), eval/accuracy at step 2 (last 1)
LENGTHS = {"grpo-s0": [10, 14], "grpo-s1": [20, 24], "dr_grpo-s0": [8, 8], "dr_grpo-s1": [10, 12]}
EVAL = {"grpo-s0": 0.25, "grpo-s1": 0.35, "dr_grpo-s0": 0.30, "dr_grpo-s1": 0.20}


def fake_run(p, status: str = "FINISHED") -> None:
    """What the trainer leaves in a run directory: config.yaml + provenance.json (tracking.provenance), run.json,
    metrics.jsonl."""
    cfg = compose_run(p.overrides, p.run_dir)
    save_provenance(cfg, p.run_dir, collect_provenance(cfg, p.run_dir))
    finish_provenance(p.run_dir, status)
    (p.run_dir / "run.json").write_text("{}")
    rows = [{"step": s + 1, "length/mean": v, "reward/mean": 0.0} for s, v in enumerate(LENGTHS[p.name])]
    rows[-1]["eval/accuracy"] = EVAL[p.name]
    (p.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def demo(tmp_path):
    spec = load_spec(DEMO)
    return spec, spec.scales["cpu"], tmp_path / "results" / DEMO


def test_the_hash_drops_where_a_run_writes_not_what_it_trains(tmp_path):
    base = ["+experiment=reproduce_tiny_demo", "tracker=none"]
    h = config_hash(compose_run(base, tmp_path / "a"))
    assert config_hash(compose_run(base, tmp_path / "b")) == h  # trainer.run_dir
    for dropped in (
        "tracker=mlflow",
        "run_name=x",
        "trainer.checkpoint_every=3",
        "trainer.progress=false",
        "distributed=ddp",
    ):
        assert config_hash(compose_run([*base, dropped], tmp_path / "a")) == h, dropped
    for kept in ("trainer.seed=1", "algorithm=dr_grpo", "trainer.max_steps=3", "optimizer.lr=2e-5"):
        assert config_hash(compose_run([*base, kept], tmp_path / "a")) != h, kept


@pytest.mark.long
def test_finished_runs_are_found_and_a_changed_one_is_named(demo):
    spec, scale, out = demo
    plans = plan_runs(spec, scale, out)
    assert [p.name for p in plans] == ["grpo-s0", "grpo-s1", "dr_grpo-s0", "dr_grpo-s1"]
    assert {p.status for p in plans} == {LAUNCH} and len({p.config_hash for p in plans}) == 4
    for p in plans:
        fake_run(p, "KILLED" if p.name == "dr_grpo-s1" else "FINISHED")
        assert saved_hash(p.run_dir) == p.config_hash  # config.yaml as written reads back to the same hash
    again = {p.name: p for p in plan_runs(spec, scale, out)}
    assert [again[n].status for n in LENGTHS] == [FINISHED, FINISHED, FINISHED, RESUME]
    # a scale or spec change: the directory holds another config
    cfg = OmegaConf.load(out / "runs" / "grpo-s1" / "config.yaml")
    cfg.trainer.max_steps = 5
    (out / "runs" / "grpo-s1" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    changed = {p.name: p for p in plan_runs(spec, scale, out)}["grpo-s1"]
    assert changed.status == CHANGED and changed.diff == ["trainer.max_steps: 5 -> 2"]


@pytest.mark.long
def test_the_table_is_the_runs_metrics_and_nothing_is_launched_again(demo, monkeypatch, capsys):
    spec, scale, out = demo
    for p in plan_runs(spec, scale, out):
        fake_run(p)
    monkeypatch.setattr(runs_module, "launch", lambda *a: pytest.fail("a finished run was launched again"))
    result = command.main([DEMO, "--out", str(out), "--ledger", str(out.parent / "README.md")])
    assert result["launched"] == []
    rows = {r["arm"]: r for r in csv.DictReader((out / f"{DEMO}.csv").open())}
    for arm in ("grpo", "dr_grpo"):
        # each run: the mean of its last 2 lengths (the demo's `last`), its last eval/accuracy (its metric's last: 1)
        lengths = [statistics.fmean(LENGTHS[f"{arm}-s{s}"]) for s in (0, 1)]
        evals = [EVAL[f"{arm}-s{s}"] for s in (0, 1)]
        assert float(rows[arm]["length/mean_mean"]) == pytest.approx(statistics.fmean(lengths))
        assert float(rows[arm]["length/mean_std"]) == pytest.approx(statistics.stdev(lengths))
        assert float(rows[arm]["eval/accuracy_mean"]) == pytest.approx(statistics.fmean(evals))
    state = json.loads((out / "reproduce.json").read_text())
    # grpo (12 + 22) / 2 = 17, dr_grpo (8 + 11) / 2 = 9.5: 9.5 / 17 = 0.559 <= 1.5, held
    assert state["verdict"] == "held" and "= 0.559 (dr_grpo 9.5 vs grpo 17)" in state["why"]
    assert state["table"]["grpo"]["length/mean"]["mean"] == pytest.approx(17.0)
    readme = (out / "README.md").read_text()
    assert f"rlexp reproduce {DEMO} --out {out}" in readme and state["git_commit"] in readme
    assert "| grpo-s0 | finished |" in readme and "-44.1 %" in readme  # 9.5 / 17 - 1
    assert "dry run" not in capsys.readouterr().out


@pytest.mark.long
def test_dry_run_writes_nothing_and_a_changed_run_is_refused_then_replaced(demo, monkeypatch):
    spec, scale, out = demo
    plans = plan_runs(spec, scale, out)
    for p in plans:
        fake_run(p)
    cfg = OmegaConf.load(plans[0].run_dir / "config.yaml")
    cfg.optimizer.lr = 1.0
    (plans[0].run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    command.main([DEMO, "--out", str(out), "--dry-run"])
    assert not (out / "README.md").exists()
    with pytest.raises(SpecError, match=r"grpo-s0: hold runs of another config .* pass --replace"):
        command.main([DEMO, "--out", str(out)])
    launched = []

    def fake_launch(p, spec, scale, *rest):
        launched.append(p.name)
        fake_run(p)

    monkeypatch.setattr(runs_module, "launch", fake_launch)
    command.main([DEMO, "--out", str(out), "--replace"])
    assert launched == ["grpo-s0"]
    (moved,) = (out / "replaced").iterdir()
    assert moved.name.startswith("grpo-s0-") and OmegaConf.load(moved / "config.yaml").optimizer.lr == 1.0


def test_extra_overrides_go_into_every_run_and_its_hash(demo):
    spec, scale, out = demo
    plain = plan_runs(spec, scale, out)
    extra = plan_runs(spec, scale, out, ["optimizer.lr=3e-5"])
    assert all(p.overrides[-2] == "optimizer.lr=3e-5" for p in extra)
    assert all(a.config_hash != b.config_hash for a, b in zip(plain, extra))


def test_the_command_names_what_is_wrong(tmp_path):
    with pytest.raises(SpecError, match=r"name an experiment: one of .*dapo_vs_grpo_smollm2"):
        command.main([])
    with pytest.raises(SpecError, match=r"'oops' is not a train override key=value"):
        command.main([DEMO, "oops"])
    with pytest.raises(SpecError, match=r"experiment 'reproduce_tiny_dem': no file .*did you mean reproduce_tiny_demo"):
        command.main(["reproduce_tiny_dem"])
    assert Path(tmp_path).is_dir()


@pytest.mark.long  # an MLflow SQLite store (~10 s to create)
def test_a_run_finished_in_the_tracker_is_not_repeated(demo, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    spec, scale, out = demo
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    plans = plan_runs(spec, scale, out, ["tracker=mlflow"])
    assert {p.status for p in plans} == {LAUNCH}  # an empty store: nothing found
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("elsewhere")
    for p in plans:  # every run made on another machine: tagged with its hash, its run directory not here
        run = client.create_run(exp, tags={"config_hash": p.config_hash, "run_dir": "/elsewhere/run"}, run_name=p.name)
        for step, v in enumerate(LENGTHS[p.name], start=1):
            client.log_metric(run.info.run_id, "length/mean", v, step=step)
        client.log_metric(run.info.run_id, "eval/accuracy", EVAL[p.name], step=2)
        client.set_terminated(run.info.run_id, "FINISHED" if p.name != "dr_grpo-s1" else "KILLED")
    again = {p.name: p for p in plan_runs(spec, scale, out, ["tracker=mlflow"])}
    assert [again[n].status for n in LENGTHS] == ["in tracker"] * 3 + [LAUNCH]
    assert again["grpo-s0"].tracker_run["tracking_uri"] == uri and again["grpo-s0"].tracker_run["run_dir"] is None
    from rlexp.reproduce.report import build_report

    fake_run(again["dr_grpo-s1"])  # the killed one, trained here
    again["dr_grpo-s1"].status = FINISHED
    built = build_report(spec, scale, list(again.values()), out, "rlexp reproduce ...", 0.0, [])
    (grpo,) = [g for g in built.groups if g.key == ("grpo",)]
    assert grpo.stat("length/mean")[0] == pytest.approx(17.0) and {r.source for r in grpo.runs} == {f"mlflow:{uri}"}
    assert built.verdict.result == "held"
