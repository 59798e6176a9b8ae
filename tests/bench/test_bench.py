"""`rlexp bench` at the tiny size: the report's content is checked, not speed."""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from rlexp.bench.harness import _finish, check_comparable, trainer_settings
from rlexp.bench.report import COLUMNS, ratios, summarise
from rlexp.config.schema import ConfigError
from tests.conftest import compose_train

REPO = Path(__file__).resolve().parents[2]
# mlflow and wandb are missing on the GPU machine: the harness must run without them
RUN = (
    "import sys, runpy; sys.modules['mlflow'] = None; sys.modules['wandb'] = None; "
    "runpy.run_module('rlexp.commands.bench', run_name='__main__', alter_sys=True)"
)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    """One run of `python3 -m rlexp.commands.bench bench_setting=tiny` from the repo root (as on the GPU machine)."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-c",
        RUN,
        "bench_setting=tiny",
        f"bench.out_dir={out}",
        f"hydra.run.dir={tmp / 'run'}",
        "bench.profile=true",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, json.loads((out / "tiny-cpu.json").read_text())


@pytest.mark.long
def test_files_are_written_and_named_by_setting_and_device(tiny_report):
    out, report = tiny_report
    assert sorted(p.name for p in out.iterdir()) == [
        "tiny-cpu-profile.txt",
        "tiny-cpu.csv",
        "tiny-cpu.json",
        "tiny-cpu.md",
    ]
    assert report["setting"] == "tiny" and report["device_slug"] == "cpu"
    assert report["command"].startswith("python3 -m rlexp.commands.bench bench_setting=tiny")


@pytest.mark.long  # reads the tiny bench run (ours and TRL's, ~15 s): the long suite
def test_profile_of_one_extra_step_by_phase(tiny_report):
    """bench.profile=true: one more step of ours under the profiler, outside the measured rows (the
    row tests below still see warm-up + measured steps only), split into the trainer's phases."""
    out, r = tiny_report
    phases = r["profile"]["phases"]
    assert set(phases) == {"rlexp.generate", "rlexp.score", "rlexp.train"}
    for name in ("rlexp.generate", "rlexp.train"):
        assert phases[name]["wall_ms"] > 0 and phases[name]["aten_ops"] > 100
        assert phases[name]["kernels"] == 0  # CPU: no device kernels
    text = (out / "tiny-cpu-profile.txt").read_text()
    assert "| rlexp.train |" in text and "aten::mm" in text
    assert "| rlexp.generate |" in (out / "tiny-cpu.md").read_text()


@pytest.mark.long  # reads the tiny bench run (ours and TRL's, ~15 s): the long suite
def test_rows_for_both_trainers_alternate(tiny_report):
    _, r = tiny_report
    total = r["warmup_steps"] + r["measured_steps"]
    assert (r["warmup_steps"], r["measured_steps"]) == (1, 2)
    assert [(x["trainer"], x["step"]) for x in r["steps"]] == [
        (t, k) for k in range(1, total + 1) for t in ("ours", "trl")
    ]
    assert [x["warmup"] for x in r["steps"]] == [k <= r["warmup_steps"] for k in range(1, total + 1) for _ in "ab"]
    assert set(r["summary"]) == {"ours", "trl"}


@pytest.mark.long  # reads the tiny bench run (ours and TRL's, ~15 s): the long suite
def test_times_positive_and_phases_within_the_step(tiny_report):
    _, r = tiny_report
    detail = r["setting_detail"]
    rows = detail["prompts_per_step"] * detail["num_generations"]
    for x in r["steps"]:
        for k in ("generate_s", "score_s", "train_s", "step_s"):
            assert x[k] > 0, (x["trainer"], x["step"], k)
        phases = x["generate_s"] + x["score_s"] + x["train_s"]
        assert phases <= x["step_s"] + 1e-9
        assert x["other_s"] == pytest.approx(x["step_s"] - phases, abs=1e-9)
        assert x["completions"] == rows
        assert 0 < x["completion_tokens"] <= rows * detail["max_new_tokens"]
        assert x["tokens_per_s"] == pytest.approx(x["completion_tokens"] / x["step_s"])
        assert x["generate_tokens_per_s"] == pytest.approx(x["completion_tokens"] / x["generate_s"])
        assert x["mean_length"] <= x["max_length"] <= detail["max_new_tokens"]
        assert x["peak_mem_mb"] > 0 and 0 <= x["mem_delta_mb"] <= x["peak_mem_mb"]


@pytest.mark.long  # reads the tiny bench run (ours and TRL's, ~15 s): the long suite
def test_summary_is_the_median_step_and_ratio_is_trl_over_ours(tiny_report):
    _, r = tiny_report
    for name in ("ours", "trl"):
        meas = [x for x in r["steps"] if x["trainer"] == name and not x["warmup"]]
        s = r["summary"][name]
        assert s["steps"] == len(meas) == 2
        assert s["step_s"] == pytest.approx(statistics.median(x["step_s"] for x in meas))
        for k in ("generate_s", "score_s", "train_s", "other_s", "completion_tokens"):
            assert s[k] == pytest.approx(sum(x[k] for x in meas) / 2)  # two steps: the mean of both
        assert s["generate_s"] + s["score_s"] + s["train_s"] + s["other_s"] == pytest.approx(s["step_s"])
        assert s["peak_mem_mb"] == max(x["peak_mem_mb"] for x in meas)
        assert s["tokens_per_s_all"] == pytest.approx(
            sum(x["completion_tokens"] for x in meas) / sum(x["step_s"] for x in meas)
        )
    for k in COLUMNS:
        ours, trl = r["summary"]["ours"][k], r["summary"]["trl"][k]
        assert r["ratio"][k] == (pytest.approx(trl / ours) if ours else None), k


@pytest.mark.long  # reads the tiny bench run (ours and TRL's, ~15 s): the long suite
def test_csv_and_markdown_carry_the_same_numbers(tiny_report):
    out, r = tiny_report
    rows = list(csv.DictReader((out / "tiny-cpu.csv").open()))
    assert [x["kind"] for x in rows] == ["step"] * len(r["steps"]) + ["median", "median", "ratio_trl_over_ours"]
    ratio = rows[-1]
    assert float(ratio["step_s"]) == pytest.approx(r["summary"]["trl"]["step_s"] / r["summary"]["ours"]["step_s"])
    assert float(rows[0]["step_s"]) == pytest.approx(r["steps"][0]["step_s"])
    md = (out / "tiny-cpu.md").read_text()
    assert r["command"] in md
    assert f"| **TRL / ours** | {r['ratio']['generate_s']:.2f} |" in md
    assert f"Step time TRL / ours = **{r['ratio']['step_s']:.2f}**" in md
    p = r["provenance"]
    assert p["git_commit"] in md and len(p["git_commit"]) == 40
    assert len(p["load_average_start"]) == 3 and str(p["load_average_start"][0]) in md
    assert p["torch"] and p["trl"] and p["transformers"] and p["device_name"]


@pytest.mark.long  # reads the tiny bench run (ours and TRL's, ~15 s): the long suite
def test_both_trainers_saw_the_same_prompts_eos_and_precision(tiny_report):
    _, r = tiny_report
    c = r["checks"]
    assert c["same_prompt_tokens_every_step"] is True
    assert c["same_eos_ids"] is True
    assert c["activation_checkpointing_ours"] is False and c["activation_checkpointing_trl"] is False
    assert c["compute_dtype_ours"] == c["compute_dtype_trl"]
    assert c["compute_dtype_ours"]["train"] != "-" and c["compute_dtype_ours"]["generate"] != "-"


# ---- the report's arithmetic on hand-made rows --------------------------------------------------------


def _row(step, gen, score, train, step_s, tokens=100.0, peak=10.0, warm=False):
    return {
        "step": step,
        "generate_s": gen,
        "score_s": score,
        "train_s": train,
        "step_s": step_s,
        "completion_tokens": tokens,
        "completions": 4,
        "max_length": 30.0,
        "reward_mean": 0.5,
        "peak_mem_mb": peak,
        "mem_delta_mb": peak / 2,
        "load1": 1.0,
    }


def test_summarise_odd_count_takes_the_middle_step_and_skips_warmup():
    rows = _finish(
        [
            _row(1, 9, 9, 9, 99, peak=500),
            _row(2, 1, 0.5, 2, 4),
            _row(3, 2, 0.5, 3, 6, peak=30),
            _row(4, 1, 0.1, 1, 2.5, tokens=50),
        ],
        "ours",
        warmup=1,
    )
    assert [x["warmup"] for x in rows] == [True, False, False, False]
    s = summarise(rows)
    assert s["steps"] == 3 and s["step_s"] == 4 and s["generate_s"] == 1 and s["train_s"] == 2
    assert s["other_s"] == pytest.approx(0.5) and s["tokens_per_s"] == pytest.approx(25.0)
    assert s["generate_tokens_per_s"] == pytest.approx(100.0) and s["max_length"] == 30
    assert s["tokens_per_s_all"] == pytest.approx(250 / 12.5)
    assert s["peak_mem_mb"] == 30  # the warm-up's 500 is not measured
    assert (s["step_s_min"], s["step_s_max"]) == (2.5, 6)


def test_summarise_even_count_averages_the_two_middle_steps():
    rows = _finish(
        [_row(1, 1, 0, 1, 3), _row(2, 2, 0, 2, 5), _row(3, 3, 0, 3, 7), _row(4, 4, 0, 4, 100)], "trl", warmup=0
    )
    s = summarise(rows)
    assert s["step_s"] == 6 and s["generate_s"] == 2.5 and s["other_s"] == pytest.approx(1.0)
    assert s["tokens_per_s"] == pytest.approx(100 / 6)


def test_ratios_are_trl_over_ours():
    ours = {k: 2.0 for k in COLUMNS}
    trl = {k: 3.0 for k in COLUMNS}
    ours["score_s"] = 0.0
    q = ratios(ours, trl)
    assert q["step_s"] == 1.5 and q["tokens_per_s"] == 1.5 and q["score_s"] is None


def test_phases_never_exceed_the_step():
    rows = _finish([_row(1, 1.0, 0.2, 0.9, 2.0)], "ours", warmup=0)
    assert rows[0]["other_s"] == pytest.approx(0.0)  # 2.1 > 2.0 (clock granularity): other is clipped at 0


# ---- settings ------------------------------------------------------------------------------------


def _bench_cfg(tmp_path, *overrides):
    return compose_train(list(overrides), tmp_path / "run", config_name="bench")


@pytest.mark.parametrize(
    "setting,shape",
    [
        ("cpu", (2, 8, 64, 16, "cpu")),
        ("gpu", (16, 8, 256, 32, "cuda")),
        ("gpu_large", (64, 8, 256, 64, "cuda")),
        ("tiny", (2, 4, 12, 4, "cpu")),
    ],
)
def test_settings_compose_and_are_comparable(tmp_path, setting, shape):
    cfg = _bench_cfg(tmp_path, f"bench_setting={setting}")
    t = trainer_settings(cfg)
    assert (t.prompts_per_step, t.num_generations, t.max_new_tokens, t.micro_batch_size, t.device) == shape
    assert cfg.bench.setting == setting and cfg.model.source == ("tiny" if setting == "tiny" else "gguf_package")
    assert list(cfg.reward.terms) == ["accuracy"] and cfg.algorithm.kl.coef == 0
    check_comparable(cfg, t)


@pytest.mark.parametrize(
    "override,key",
    [
        ("algorithm.kl.coef=0.04", "algorithm.kl.coef"),
        ("reward=accuracy_format", "reward.terms"),
        ("algorithm=dr_grpo", "algorithm.aggregation"),
        ("trainer.num_iterations=2", "trainer.num_iterations"),
        ("trainer.micro_batch_size=3", "trainer.micro_batch_size"),
        ("+algorithm.num_generations=1", "algorithm.num_generations"),
    ],
)
def test_incomparable_settings_are_refused(tmp_path, override, key):
    cfg = _bench_cfg(tmp_path, "bench_setting=tiny", override)
    with pytest.raises(ConfigError, match=key):
        check_comparable(cfg, trainer_settings(cfg))


def test_cli_dispatches_bench(capsys):
    from rlexp.cli import main

    main(["bench", "bench_setting=gpu_large", "--cfg", "job"])
    printed = capsys.readouterr().out
    assert "prompts_per_step: 64" in printed and "max_new_tokens: 256" in printed and "setting: gpu_large" in printed


@pytest.mark.long
def test_prompt_check_catches_trl_seeing_other_prompts(tmp_path, monkeypatch):
    """The same-prompts check is real: feed TRL the prompts in reverse order and it reports False."""
    from rlexp.bench import harness as bench
    from rlexp.bench import trl_side as bench_trl

    original = bench_trl.bench_dataset
    monkeypatch.setattr(bench_trl, "bench_dataset", lambda records, fmt: original(records[::-1], fmt))
    cfg = _bench_cfg(
        tmp_path, "bench_setting=tiny", "bench.warmup_steps=0", "bench.steps=1", f"bench.out_dir={tmp_path / 'out'}"
    )
    import torch

    threads = torch.get_num_threads()
    try:
        report = bench.run(cfg, "test")
    finally:
        torch.set_num_threads(threads)  # the tiny setting uses one thread: leave the session as it was
    assert report["checks"]["same_prompt_tokens_every_step"] is False
    assert report["checks"]["same_eos_ids"] is True
    assert (tmp_path / "out" / "tiny-cpu.md").exists()


def test_default_output_is_the_bench_run_dir_not_the_committed_results(tmp_path):
    """``rlexp bench`` writes into its own run directory unless ``bench.out_dir`` names another folder, so a bench
    run never overwrites ``results/bench``."""
    cfg = compose_train([], tmp_path / "bench-run", config_name="bench")
    assert cfg.bench.out_dir == str(tmp_path / "bench-run")
