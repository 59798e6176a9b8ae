"""The end-of-run summary of ``rlexp train``: where the run went (run directory, tracker runs and how to open
them), what it learnt (the headline metrics over its first steps against its last), and what it left on disk
(checkpoints and their sizes). Printed at the end of a run and written to ``<run dir>/summary.md``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from rlexp.tracking.base import read_jsonl
from rlexp.trainer.checkpoint import checkpoint_step, dir_size, human_size, kept_checkpoints

# sft/loss, distill/loss: the SFT and distillation stages (rlexp.sft), which have no reward; a metric a run does not
# log is left out of its table
HEADLINE = (
    "accuracy",
    "reward/mean",
    "eval/accuracy",
    "length/mean",
    "entropy/mean",
    "sft/loss",
    "distill/loss",
    "time/step_s",
)


@dataclass
class RunSummary:
    run_dir: Path
    status: str
    steps: list[int]
    rows: list[tuple[str, float, float, int]]  # metric, first-window mean, last-window mean, window
    trackers: list[dict[str, str]] = field(default_factory=list)
    checkpoints: list[tuple[Path, int, int | None]] = field(default_factory=list)  # path, bytes, step
    held_out: tuple[float, int, float, int] | None = None  # eval/accuracy: first value, its step, last, its step

    def lines(self) -> list[str]:
        """The summary as markdown lines (the file and the terminal print the same text)."""
        out = [f"# Run summary: {self.run_dir.name}", "", f"- status: {self.status}"]
        last = self.steps[-1] if self.steps else 0
        trained = [s for s in self.steps if s > 0]  # step 0 holds only the evaluation before training
        out.append(f"- run directory: `{self.run_dir}` ({len(trained)} logged steps, last {last})")
        out += [f"- {t['tracker']}: run `{t['run_id']}` in `{t['where']}`; open: `{t['open']}`" for t in self.trackers]
        if not self.trackers:
            out.append("- tracker: none (every metric is in `metrics.jsonl`)")
        if self.held_out is not None:
            a, sa, b, sb = self.held_out
            out.append(f"- held-out accuracy (greedy): {a:.3f} at step {sa} → {b:.3f} at step {sb}")
        if self.checkpoints:
            total = sum(b for _, b, _ in self.checkpoints)
            kept = ", ".join(f"`{p}` (step {s}, {human_size(b)})" for p, b, s in self.checkpoints)
            out.append(f"- checkpoints: {kept}; {human_size(total)} on disk")
        else:
            out.append("- checkpoints: none kept")
        if self.rows:
            w = self.rows[0][3]
            span = "step" if w == 1 else f"mean of {w} steps"
            out += ["", f"| metric | first ({span}) | last ({span}) | change |", "|---|---|---|---|"]
            out += [f"| {k} | {_num(a)} | {_num(b)} | {_num(b - a, '+')} |" for k, a, b, _ in self.rows]
        return out

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"


def _num(v: float, sign: str = "") -> str:
    return "–" if math.isnan(v) else f"{v:{sign}.4g}"


def window_means(rows: list[dict], key: str, window: int) -> tuple[float, float] | None:
    """Mean of the first and of the last ``window`` values of ``key`` (first: NaN when there is one value)."""
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not values:
        return None
    if len(values) == 1:
        return math.nan, values[0]
    w = min(window, len(values) // 2)
    return sum(values[:w]) / w, sum(values[-w:]) / w


def summarise(run_dir: str | Path, status: str = "FINISHED", trackers: list[dict] | None = None) -> RunSummary:
    """The summary of the run in ``run_dir`` from its ``metrics.jsonl`` and ``checkpoints/``; the window is
    a quarter of the logged steps, 1 to 5."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path) if path.exists() else []
    by_step = {int(r["step"]): r for r in rows}  # a step logged twice (resume) counts once
    ordered = [by_step[s] for s in sorted(by_step)]
    window = max(1, min(5, len(ordered) // 4))
    table = []
    for key in HEADLINE:
        means = window_means(ordered, key, 1 if key.startswith("eval/") else window)
        if means is not None:
            table.append((key, *means, 1 if key.startswith("eval/") else window))
    checkpoints = [(p, dir_size(p), checkpoint_step(p)) for p in kept_checkpoints(run_dir / "checkpoints")]
    evals = [(s, r["eval/accuracy"]) for s, r in sorted(by_step.items()) if _finite(r.get("eval/accuracy"))]
    held_out = (evals[0][1], evals[0][0], evals[-1][1], evals[-1][0]) if len(evals) > 1 else None
    return RunSummary(run_dir, status, sorted(by_step), table, list(trackers or []), checkpoints, held_out)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def write_summary(summary: RunSummary) -> Path:
    path = summary.run_dir / "summary.md"
    path.write_text(summary.text())
    return path


def print_summary(summary: RunSummary) -> None:
    """The summary on the terminal (rich markdown), or as plain text where stdout is not one."""
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console()
    if console.is_terminal:
        console.print(Markdown(summary.text()))
    else:
        print(summary.text(), flush=True)
