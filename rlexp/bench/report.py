"""The bench report: per-step rows summarised (median step), TRL / ours ratios, provenance, and the markdown /
CSV / JSON files."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import torch

from rlexp.tracking.provenance import cpu_model

REPO = Path(__file__).resolve().parents[2]


PHASES = ("generate_s", "score_s", "train_s", "other_s")


COLUMNS = (
    "generate_s",
    "score_s",
    "train_s",
    "other_s",
    "step_s",
    "completion_tokens",
    "tokens_per_s",
    "generate_tokens_per_s",
    "tokens_per_s_all",
    "peak_mem_mb",
    "mem_delta_mb",
    "mean_length",
    "max_length",
    "reward_mean",
)


def summarise(rows: list[dict]) -> dict:
    """The median step by step time (mean of the two middle steps for an even count) of the
    measured steps; peak memory is the maximum over them; ``tokens_per_s_all`` is all measured
    completion tokens over all measured step time (less sensitive to one step's sampled lengths)."""
    meas = sorted((r for r in rows if not r["warmup"]), key=lambda r: r["step_s"])
    if not meas:
        raise ValueError("no measured steps (bench.steps must be >= 1)")
    mid = [meas[(len(meas) - 1) // 2], meas[len(meas) // 2]]
    s = {
        k: (mid[0][k] + mid[1][k]) / 2 for k in COLUMNS if k not in ("peak_mem_mb", "mem_delta_mb", "tokens_per_s_all")
    }
    s["tokens_per_s"] = s["completion_tokens"] / s["step_s"]
    s["generate_tokens_per_s"] = s["completion_tokens"] / s["generate_s"]
    s["tokens_per_s_all"] = sum(r["completion_tokens"] for r in meas) / sum(r["step_s"] for r in meas)
    s["peak_mem_mb"] = max(r["peak_mem_mb"] for r in meas)
    s["mem_delta_mb"] = max(r["mem_delta_mb"] for r in meas)
    s["steps"] = len(meas)
    s["step_s_min"], s["step_s_max"] = meas[0]["step_s"], meas[-1]["step_s"]
    return s


def ratios(ours: dict, trl: dict) -> dict:
    """TRL / ours for every summary column (None where ours is 0)."""
    return {k: (trl[k] / ours[k] if ours[k] else None) for k in COLUMNS}


def git_info() -> dict:
    def git(*args):
        try:
            return subprocess.run(
                ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit or "unknown", "git_dirty": bool(dirty) if commit else None}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return "cuda-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def _fmt(v, nd=3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def write_report(report: dict, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{report['setting']}-{report['device_slug']}"
    paths = {ext: out_dir / f"{stem}.{ext}" for ext in ("md", "csv", "json")}
    report["files"] = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(json.dumps(report, indent=1, default=str) + "\n")
    fields = ["kind", "trainer", "step", "warmup", *COLUMNS, "load1"]
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in report["steps"]:
            w.writerow({"kind": "step", **r})
        for name, s in report["summary"].items():
            w.writerow({"kind": "median", "trainer": name, **s})
        if report.get("ratio"):
            w.writerow({"kind": "ratio_trl_over_ours", "trainer": "trl/ours", **report["ratio"]})
    paths["md"].write_text(markdown(report))
    return paths


def markdown(r: dict) -> str:
    p = r["provenance"]
    s = r["setting_detail"]
    lines = [
        f"# Bench: {r['setting']} on {p['device_name']}",
        "",
        f"`{r['command']}`",
        "",
        f"{s['prompts_per_step']} prompts × G={s['num_generations']} × {s['max_new_tokens']} new tokens, "
        f"micro-batch {s['micro_batch_size']}, lr {s['lr']}, temperature {s['temperature']}, "
        f"top_k {s['top_k']}, top_p {s['top_p']}, β=0, μ=1; {r['warmup_steps']} warm-up + {r['measured_steps']} "
        f"measured steps each, order: {r['order']}.",
        "",
    ]
    head = (
        "| trainer | generate s | score s | train s | other s | step s (min–max) | tokens | tokens/s | "
        "generate tokens/s | tokens/s, all measured | peak mem MB | Δmem MB | mean len | max len | reward |"
    )
    lines += [
        "## Median step",
        "",
        "The measured step with the median step time (the mean of the two middle steps "
        "for an even count); peak memory: the maximum over the measured steps; tokens/s, all measured: every "
        "measured completion token over all measured step time.",
        "",
        head,
        "|" + "---|" * 15,
    ]
    for name, m in r["summary"].items():
        lines.append(
            f"| {name} | {_fmt(m['generate_s'])} | {_fmt(m['score_s'])} | {_fmt(m['train_s'])} | "
            f"{_fmt(m['other_s'])} | {_fmt(m['step_s'])} ({_fmt(m['step_s_min'])}–{_fmt(m['step_s_max'])}) | "
            f"{_fmt(m['completion_tokens'], 1)} | {_fmt(m['tokens_per_s'], 1)} | "
            f"{_fmt(m['generate_tokens_per_s'], 1)} | {_fmt(m['tokens_per_s_all'], 1)} | {_fmt(m['peak_mem_mb'], 0)} | "
            f"{_fmt(m['mem_delta_mb'], 0)} | {_fmt(m['mean_length'], 1)} | {_fmt(m['max_length'], 1)} | "
            f"{_fmt(m['reward_mean'])} |"
        )
    q = r.get("ratio")
    if q:
        lines.append("| **TRL / ours** | " + " | ".join(_fmt(q[k], 2) for k in COLUMNS) + " |")
        lines += [
            "",
            f"Step time TRL / ours = **{q['step_s']:.2f}** (>1: ours faster); completion tokens/s "
            f"TRL / ours = **{q['tokens_per_s']:.2f}** for the median step, **{q['tokens_per_s_all']:.2f}** "
            "over all measured steps (<1: ours faster). Completion lengths are sampled, so tokens/s moves "
            "with them; the step time is the steadier comparison while generation runs to the same "
            "max length on both sides (max len).",
        ]
    lines += [
        "",
        "## Every step (in the order they ran)",
        "",
        "| trainer | step | warm-up | generate s | score s | train s | other s | step s | tokens | max len | "
        "tokens/s | peak mem MB | Δmem MB | load1 |",
        "|" + "---|" * 14,
    ]
    for x in r["steps"]:
        lines.append(
            f"| {x['trainer']} | {x['step']} | {_fmt(x['warmup'])} | {_fmt(x['generate_s'])} | {_fmt(x['score_s'])} | "
            f"{_fmt(x['train_s'])} | {_fmt(x['other_s'])} | {_fmt(x['step_s'])} | {_fmt(x['completion_tokens'], 0)} | "
            f"{_fmt(x['max_length'], 0)} | {_fmt(x['tokens_per_s'], 1)} | {_fmt(x['peak_mem_mb'], 0)} | "
            f"{_fmt(x['mem_delta_mb'], 0)} | {_fmt(x['load1'], 2)} |"
        )
    if r.get("profile"):
        lines += [
            "",
            "## One profiled step of ours (after the measured ones)",
            "",
            f"`{Path(r['profile']['file']).name}`: ATen ops the host dispatched and, on CUDA, the kernels "
            "launched and their GPU time, per phase (`rlexp/bench/profile.py`).",
            "",
            "| phase | wall ms | ATen ops | kernels | kernel ms |",
            "|---|---|---|---|---|",
        ]
        gpu = r["device_slug"] != "cpu"
        lines += [
            f"| {name} | {v['wall_ms']:.1f} | {v['aten_ops']} | {v['kernels'] if gpu else 'n/a'} | "
            f"{_fmt(v['kernel_ms'], 1) if gpu else 'n/a'} |"
            for name, v in r["profile"]["phases"].items()
        ]
    lines += ["", "## Provenance", ""]
    lines += [f"- {k}: {_fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)}" for k, v in p.items()]
    lines += ["", "## Checks", ""]
    lines += [f"- {k}: {_fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v)}" for k, v in r["checks"].items()]
    lines += ["", "## What the phases cover", "", *[f"- {x}" for x in r["phase_notes"]], ""]
    return "\n".join(lines)


PHASE_NOTES = [
    "ours generate: prompt rendering with the chat template + tokenisation, the rollout (rlexp's decode loop, or "
    "model.generate with the sampling log-prob recorder: rollout.engine), EOS masking, decoding "
    "(Trainer.rollout_and_score minus scoring)",
    "ours score: every reward term on every completion (rlexp.rewards.scoring.score)",
    "ours train: advantages + policy_update (forward + backward of each micro-batch, gradient clipping, "
    "optimizer.step)",
    "ours other: step wall time minus the three (group stages, batch assembly)",
    "TRL generate: GRPOTrainer._generate (chat-template tokenisation, padding, model.generate, EOS masking, "
    "decoding, length metrics)",
    "TRL score: GRPOTrainer._calculate_rewards (the same Accuracy term behind TRL's reward signature, gather)",
    "TRL train: on_step_begin -> on_step_end minus generate and score (rest of _generate_and_score_completions: "
    "padding, advantages, metrics, shuffle/split; forward + backward of each micro-batch; clipping; "
    "optimizer.step; scheduler; zero_grad)",
    "TRL other: the transformers loop between steps (log/save checks, fetching the next batch)",
    "tokens: completion tokens of the step including the EOS token (mask up to the first EOS), both sides",
]
