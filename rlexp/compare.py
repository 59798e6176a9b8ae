"""`rlexp compare`: put runs side by side, aggregated over seeds.

Runs come from MLflow (``--tracking-uri``, ``--experiment``, ``--tag key=value``, ``--filter`` with
MLflow's search syntax) or from run directories (``--runs DIR``: each ``metrics.jsonl`` below DIR).
Runs are grouped by their identity tags except the seed (``--group-by``, default
algorithm,dataset,model,benchmark; ``params.<key>`` groups by a config value). Per run a metric's
value is its last logged value (the mean of the last ``--last K`` values); per group, the mean ±
sample standard deviation over its runs.

Output (the results/ format, written to ``--out``, file names prefixed by ``--name``):

* ``<name>.md`` — the command, the table (``mean ± std`` cells, ``n`` runs, their seeds), the runs
  with their ids and git commits, and the curve plots;
* ``<name>.csv`` — one row per group: group columns, ``n``, ``seeds``, ``<metric>_mean``, ``<metric>_std``;
* ``<name>_runs.csv`` — one row per run: id, name, source, tags, one column per metric;
* ``<name>_<metric>.png`` — the learning curve of each metric: mean over seeds per step with a ±std
  band, one line per group.

The table is also printed to the terminal. Metrics (``--metrics``, names or regular expressions)
default to whichever of reward, accuracy, entropy, length, consistency and pass@k exist.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_METRICS = (r"reward/mean", r"accuracy", r"eval/(.+/)?accuracy", r"entropy/mean", r"length/mean",
                   r"(.+/)?consistency/\w*(rate|mean)", r"(.+/)?consistency_rate", r"(.+/)?pass_at_\d+")
DEFAULT_GROUP_BY = ("algorithm", "dataset", "model", "benchmark")


@dataclass
class RunRecord:
    """One run: its id, display name, where it came from, tags, params and metric histories
    (``{metric: [(step, value), ...]}`` sorted by step)."""
    run_id: str
    name: str
    source: str
    tags: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    history: dict = field(default_factory=dict)

    def attr(self, key: str) -> str:
        if key.startswith("params."):
            return str(self.params.get(key[len("params."):], "?"))
        return str(self.tags.get(key[len("tags."):] if key.startswith("tags.") else key, "?"))


@dataclass
class Group:
    key: tuple
    runs: list
    values: dict      # metric -> per-run values (None where a run lacks it)

    def stat(self, metric: str) -> tuple[float, float, int]:
        vals = [v for v in self.values[metric] if v is not None]
        if not vals:
            return math.nan, math.nan, 0
        return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals)

    @property
    def seeds(self) -> list[str]:
        return sorted({r.tags.get("seed", "?") for r in self.runs}, key=lambda s: (len(s), s))


# ---- selecting runs ------------------------------------------------------------------------------
def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlruns.db'}"


def mlflow_filter(filter_string: str | None, tags: dict[str, str]) -> str:
    """An MLflow search filter from a raw filter and ``key=value`` tag conditions."""
    parts = [f"({filter_string})"] if filter_string else []
    for k, v in tags.items():
        parts.append(f"tags.`{k}` = '{v}'")
    return " and ".join(parts)


def mlflow_runs(tracking_uri: str, experiments: list[str] | None = None, filter_string: str | None = None,
                tags: dict[str, str] | None = None, metrics: list[str] | None = None,
                max_runs: int = 1000) -> list[RunRecord]:
    """Runs of the named experiments (default: all) matching the filter, with the histories of the
    metrics matching ``metrics`` (names or regular expressions; default ``DEFAULT_METRICS``)."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType
    if tracking_uri.startswith(("http://", "https://")):
        from rlexp.tracking.mlflow_tracker import bound_http_waits
        bound_http_waits()
    client = MlflowClient(tracking_uri=tracking_uri)
    if experiments:
        ids = []
        for name in experiments:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise SystemExit(f"rlexp compare: --experiment {name!r} not found at {tracking_uri}")
            ids.append(exp.experiment_id)
    else:
        ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not ids:
        return []
    found = client.search_runs(ids, filter_string=mlflow_filter(filter_string, tags or {}), max_results=max_runs,
                               order_by=["attributes.start_time ASC"])
    patterns = compile_patterns(metrics)
    out = []
    for r in found:
        keys = [k for k in r.data.metrics if matches(k, patterns)]
        hist = {k: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, k)) for k in keys}
        out.append(RunRecord(r.info.run_id, r.info.run_name or r.info.run_id, f"mlflow:{tracking_uri}",
                             dict(r.data.tags), dict(r.data.params), hist))
    return out


def local_runs(paths: list[str | Path], metrics: list[str] | None = None) -> list[RunRecord]:
    """Runs from run directories: every ``metrics.jsonl`` at or below each path, with the tags the
    run's ``config.yaml`` and ``provenance.json`` give."""
    import json

    from omegaconf import OmegaConf

    from rlexp.tracking.base import read_jsonl
    from rlexp.tracking.provenance import benchmark_name, run_tags
    patterns = compile_patterns(metrics)
    out = []
    for root in paths:
        root = Path(root)
        files = [root / "metrics.jsonl"] if (root / "metrics.jsonl").exists() else sorted(root.rglob("metrics.jsonl"))
        if not files:
            raise SystemExit(f"rlexp compare: no metrics.jsonl at or below {root}")
        for f in files:
            d = f.parent
            tags, params = {"run_dir": str(d.resolve())}, {}
            if (d / "config.yaml").exists():
                from rlexp.train import flatten
                cfg = OmegaConf.load(d / "config.yaml")
                params = flatten(OmegaConf.to_container(cfg, resolve=False))
                if (d / "provenance.json").exists():
                    tags = run_tags(cfg, json.loads((d / "provenance.json").read_text()), d)
                else:
                    tags.update(algorithm=cfg.algorithm.name, dataset=cfg.dataset.name, model=cfg.model.name,
                                benchmark=benchmark_name(cfg), seed=str(cfg.trainer.seed))
            hist: dict[str, list] = {}
            for row in read_jsonl(f):
                for k, v in row.items():
                    if k not in ("step", "time") and v is not None and matches(k, patterns):
                        hist.setdefault(k, []).append((int(row["step"]), float(v)))
            hist = {k: sorted(dict(v).items()) for k, v in hist.items()}  # a step logged twice counts once
            name = tags.get("mlflow.runName") or d.name
            out.append(RunRecord(str(d), name, "local", tags, params, hist))
    return out


def compile_patterns(metrics: list[str] | None) -> list[re.Pattern]:
    return [re.compile(m) for m in (metrics or DEFAULT_METRICS)]


def matches(key: str, patterns: list[re.Pattern]) -> bool:
    return any(p.fullmatch(key) for p in patterns)


def order_metrics(keys: set[str], metrics: list[str] | None) -> list[str]:
    """Metric columns in the order of the patterns that selected them."""
    out = []
    for p in compile_patterns(metrics):
        out += sorted(k for k in keys if p.fullmatch(k) and k not in out)
    return out


# ---- aggregating -----------------------------------------------------------------------------------
def final_value(points: list[tuple[int, float]], last: int = 1) -> float | None:
    vals = [v for _, v in points[-last:] if v is not None and math.isfinite(v)]
    return statistics.fmean(vals) if vals else None


def group_runs(runs: list[RunRecord], group_by: list[str], metrics: list[str], last: int = 1) -> list[Group]:
    groups: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        groups.setdefault(tuple(r.attr(g) for g in group_by), []).append(r)
    return [Group(k, rs, {m: [final_value(r.history.get(m, []), last) for r in rs] for m in metrics})
            for k, rs in sorted(groups.items())]


def varying_columns(groups: list[Group], group_by: list[str]) -> list[int]:
    """Indices of the group-by columns whose value differs between groups (at least the first)."""
    idx = [i for i in range(len(group_by)) if len({g.key[i] for g in groups}) > 1]
    return idx or [0]


def curve(group: Group, metric: str) -> tuple[list[int], list[float], list[float]]:
    """Per step: mean and std over the group's runs that logged the metric at that step."""
    by_step: dict[int, list[float]] = {}
    for r in group.runs:
        for s, v in r.history.get(metric, []):
            if v is not None and math.isfinite(v):
                by_step.setdefault(s, []).append(v)
    steps = sorted(by_step)
    means = [statistics.fmean(by_step[s]) for s in steps]
    stds = [statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps]
    return steps, means, stds


def smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out = []
    for i in range(len(values)):
        w = values[max(0, i - window + 1): i + 1]
        out.append(sum(w) / len(w))
    return out


# ---- output ------------------------------------------------------------------------------------------
def fmt(mean: float, std: float, n: int, digits: int = 3) -> str:
    if n == 0 or math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def table_rows(groups: list[Group], group_by: list[str], metrics: list[str], digits: int = 3):
    cols = varying_columns(groups, group_by)
    header = [group_by[i] for i in cols] + ["n", "seeds"] + metrics
    rows = [[g.key[i] for i in cols] + [str(len(g.runs)), ", ".join(g.seeds)] +
            [fmt(*g.stat(m), digits) for m in metrics] for g in groups]
    return header, rows


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


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_")


def plot_curves(groups: list[Group], group_by: list[str], metrics: list[str], out: Path, name: str,
                smooth_window: int = 1) -> list[Path]:
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
            line, = ax.plot(steps, means, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
            if any(s > 0 for s in stds):
                ax.fill_between(steps, [a - b for a, b in zip(means, stds)], [a + b for a, b in zip(means, stds)],
                                color=line.get_color(), alpha=0.2, linewidth=0)
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


def write_outputs(groups: list[Group], runs: list[RunRecord], group_by: list[str], metrics: list[str], out: Path,
                  name: str, command: str, last: int = 1, smooth_window: int = 1, digits: int = 3) -> dict:
    """Write ``<name>.md``, ``<name>.csv``, ``<name>_runs.csv`` and the PNG curves; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    cols = varying_columns(groups, group_by)
    with (out / f"{name}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([group_by[i] for i in cols] + ["n", "seeds"] + [f"{m}_{s}" for m in metrics for s in ("mean", "std")])
        for g in groups:
            stats = [g.stat(m) for m in metrics]
            w.writerow([g.key[i] for i in cols] + [len(g.runs), " ".join(g.seeds)] +
                       [x for mean, std, n in stats for x in (_num(mean), _num(std) if n > 1 else "")])
    with (out / f"{name}_runs.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run_id", "name", "source", *group_by, "seed", "git_commit", *metrics])
        for g in groups:
            for i, r in enumerate(g.runs):
                w.writerow([r.run_id, r.name, r.source, *g.key, r.tags.get("seed", ""), r.tags.get("git_commit", ""),
                            *[_num(g.values[m][i]) for m in metrics]])
    pngs = plot_curves(groups, group_by, metrics, out, name, smooth_window)
    header, rows = table_rows(groups, group_by, metrics, digits)
    what = "the last logged value" if last == 1 else f"the mean of the last {last} logged values"
    md = [f"# {name}", "", f"Command: `{command}`", "",
          markdown_table(header, rows), "",
          f"Each cell: {what} of a run, mean ± sample std over the group's runs (seeds); n = runs.", "",
          "## Runs", "",
          markdown_table(["run", "name", "seed", "git commit", "source"],
                         [[r.run_id, r.name, r.tags.get("seed", "?"), r.tags.get("git_commit", "?")[:12], r.source]
                          for g in groups for r in g.runs])]
    if pngs:
        md += ["", "## Curves", ""] + [f"![{p.stem}]({p.name})" for p in pngs]
    (out / f"{name}.md").write_text("\n".join(md) + "\n")
    return {"markdown": out / f"{name}.md", "csv": out / f"{name}.csv", "runs_csv": out / f"{name}_runs.csv",
            "png": pngs}


def _num(v):
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(float(v))


def _parse_tags(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"rlexp compare: --tag {item!r} must be KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="rlexp compare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: rlexp compare --experiment rlexp --tag dataset=basic_arithmetic "
                                       "--out results/grpo_vs_dr_grpo")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                                                        "sqlite:///./mlruns.db)")
    p.add_argument("--experiment", action="append", help="MLflow experiment name (repeatable; default: all)")
    p.add_argument("--tag", action="append", default=[], help="KEY=VALUE tag condition (repeatable)")
    p.add_argument("--filter", help="MLflow search filter, e.g. \"params.`optimizer.lr` = '1e-05'\"")
    p.add_argument("--runs", action="append", help="run directory (or a folder of them) instead of MLflow (repeatable)")
    p.add_argument("--group-by", default=",".join(DEFAULT_GROUP_BY), help="comma-separated tags or params.<key>")
    p.add_argument("--metrics", help="comma-separated metric names or regular expressions")
    p.add_argument("--last", type=int, default=1, help="average the last K logged values of each run (default 1)")
    p.add_argument("--smooth", type=int, default=1, help="moving-average window of the curves (default 1)")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--out", default="compare", help="output folder (default ./compare)")
    p.add_argument("--name", default="compare", help="file name prefix (default compare)")
    a = p.parse_args(argv)
    if a.last < 1:
        raise SystemExit(f"rlexp compare: --last={a.last} must be >= 1")
    metrics_arg = [m.strip() for m in a.metrics.split(",")] if a.metrics else None
    if a.runs:
        runs = local_runs(a.runs, metrics_arg)
    else:
        runs = mlflow_runs(a.tracking_uri or default_tracking_uri(), a.experiment, a.filter, _parse_tags(a.tag),
                           metrics_arg)
    runs = [r for r in runs if r.history]
    if not runs:
        raise SystemExit("rlexp compare: no runs with matching metrics were found")
    metrics = order_metrics({k for r in runs for k in r.history}, metrics_arg)
    group_by = [g.strip() for g in a.group_by.split(",") if g.strip()]
    groups = group_runs(runs, group_by, metrics, a.last)
    command = "rlexp compare " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    print_table(groups, group_by, metrics, title=f"{a.name}: {len(runs)} runs, {len(groups)} groups", digits=a.digits)
    paths = write_outputs(groups, runs, group_by, metrics, Path(a.out), a.name, command, a.last, a.smooth, a.digits)
    print(f"wrote {paths['markdown']}, {paths['csv']}, {paths['runs_csv']} and {len(paths['png'])} PNG curves "
          f"in {a.out}")
    return paths


if __name__ == "__main__":
    main()
