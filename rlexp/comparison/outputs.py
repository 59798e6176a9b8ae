"""What a comparison writes: the terminal table, and the results/ format (markdown, CSV, PNG curves)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from rlexp.comparison.groups import Group, curve, markdown_table, slug, smooth, table_rows, varying_columns
from rlexp.comparison.runs import RunRecord


def print_table(groups: list[Group], group_by: list[str], metrics: list[str], title: str, digits: int = 3) -> None:
    from rich.console import Console
    from rich.table import Table

    header, rows = table_rows(groups, group_by, metrics, digits)
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i < len(header) - len(metrics) else "right")
    for r in rows:
        t.add_row(*r)
    Console(width=max(120, 12 * len(header))).print(t)


def plot_curves(
    groups: list[Group], group_by: list[str], metrics: list[str], out: Path, name: str, smooth_window: int = 1
) -> list[Path]:
    """One PNG per metric with at least one point: mean over seeds per step, ±std band, one line
    per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = varying_columns(groups, group_by)
    paths = []
    for m in metrics:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
        drawn = False
        for g in groups:
            steps, means, stds = curve(g, m)
            if not steps:
                continue
            means, stds = smooth(means, smooth_window), smooth(stds, smooth_window)
            label = " / ".join(g.key[i] for i in cols) + f" (n={len(g.runs)})"
            (line,) = ax.plot(steps, means, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
            if any(s > 0 for s in stds):
                ax.fill_between(
                    steps,
                    [a - b for a, b in zip(means, stds)],
                    [a + b for a, b in zip(means, stds)],
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                )
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(m)
        ax.set_title(f"{m} (mean ± std over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}_{slug(m)}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def write_outputs(
    groups: list[Group],
    runs: list[RunRecord],
    group_by: list[str],
    metrics: list[str],
    out: Path,
    name: str,
    command: str,
    last: int = 1,
    smooth_window: int = 1,
    digits: int = 3,
) -> dict:
    """Write ``<name>.md``, ``<name>.csv``, ``<name>_runs.csv`` and the PNG curves; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    cols = varying_columns(groups, group_by)
    with (out / f"{name}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [group_by[i] for i in cols] + ["n", "seeds"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std")]
        )
        for g in groups:
            stats = [g.stat(m) for m in metrics]
            w.writerow(
                [g.key[i] for i in cols]
                + [len(g.runs), " ".join(g.seeds)]
                + [x for mean, std, n in stats for x in (_num(mean), _num(std) if n > 1 else "")]
            )
    with (out / f"{name}_runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "name", "source", *group_by, "seed", "git_commit", *metrics])
        for g in groups:
            for i, r in enumerate(g.runs):
                w.writerow(
                    [
                        r.run_id,
                        r.name,
                        r.source,
                        *g.key,
                        r.tags.get("seed", ""),
                        r.tags.get("git_commit", ""),
                        *[_num(g.values[m][i]) for m in metrics],
                    ]
                )
    pngs = plot_curves(groups, group_by, metrics, out, name, smooth_window)
    header, rows = table_rows(groups, group_by, metrics, digits)
    what = "the last logged value" if last == 1 else f"the mean of the last {last} logged values"
    md = [
        f"# {name}",
        "",
        f"Command: `{command}`",
        "",
        markdown_table(header, rows),
        "",
        f"Each cell: {what} of a run, mean ± sample std over the group's runs (seeds); n = runs.",
        "",
        "## Runs",
        "",
        markdown_table(
            ["run", "name", "seed", "git commit", "source"],
            [
                [r.run_id, r.name, r.tags.get("seed", "?"), r.tags.get("git_commit", "?")[:12], r.source]
                for g in groups
                for r in g.runs
            ],
        ),
    ]
    if pngs:
        md += ["", "## Curves", ""] + [f"![{p.stem}]({p.name})" for p in pngs]
    (out / f"{name}.md").write_text("\n".join(md) + "\n")
    return {
        "markdown": out / f"{name}.md",
        "csv": out / f"{name}.csv",
        "runs_csv": out / f"{name}_runs.csv",
        "png": pngs,
    }


def _num(v):
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(float(v))
