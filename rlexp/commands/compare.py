"""``rlexp compare``: put runs side by side, aggregated over seeds (``rlexp.comparison``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rlexp import comparison
from rlexp.comparison.groups import group_runs, order_metrics
from rlexp.comparison.outputs import print_table, write_outputs
from rlexp.comparison.runs import DEFAULT_GROUP_BY, default_tracking_uri, local_runs, mlflow_runs


def _parse_tags(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"rlexp compare: --tag {item!r} must be KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = v
    return out


def default_out(name: str) -> Path:
    """``outputs/compare/<date>/<time>-<name>``: like a run directory, never a committed folder."""
    import time

    return Path("outputs") / "compare" / time.strftime("%Y-%m-%d") / f"{time.strftime('%H-%M-%S')}-{name}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog="rlexp compare",
        description=comparison.__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: rlexp compare --experiment rlexp --tag dataset=basic_arithmetic --out results/grpo_vs_dr_grpo",
    )
    p.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///./mlruns.db)",
    )
    p.add_argument("--experiment", action="append", help="MLflow experiment name (repeatable; default: all)")
    p.add_argument("--tag", action="append", default=[], help="KEY=VALUE tag condition (repeatable)")
    p.add_argument("--filter", help="MLflow search filter, e.g. \"params.`optimizer.lr` = '1e-05'\"")
    p.add_argument("--runs", action="append", help="run directory (or a folder of them) instead of MLflow (repeatable)")
    p.add_argument("--group-by", default=",".join(DEFAULT_GROUP_BY), help="comma-separated tags or params.<key>")
    p.add_argument("--metrics", help="comma-separated metric names or regular expressions")
    p.add_argument("--last", type=int, default=1, help="average the last K logged values of each run (default 1)")
    p.add_argument("--smooth", type=int, default=1, help="moving-average window of the curves (default 1)")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default: outputs/compare/<date>/<time>-<name>, git-ignored beside the runs)",
    )
    p.add_argument("--name", default="compare", help="file name prefix (default compare)")
    a = p.parse_args(argv)
    if a.last < 1:
        raise SystemExit(f"rlexp compare: --last={a.last} must be >= 1")
    metrics_arg = [m.strip() for m in a.metrics.split(",")] if a.metrics else None
    if a.runs:
        runs = local_runs(a.runs, metrics_arg)
    else:
        runs = mlflow_runs(
            a.tracking_uri or default_tracking_uri(), a.experiment, a.filter, _parse_tags(a.tag), metrics_arg
        )
    runs = [r for r in runs if r.history]
    if not runs:
        raise SystemExit("rlexp compare: no runs with matching metrics were found")
    metrics = order_metrics({k for r in runs for k in r.history}, metrics_arg)
    group_by = [g.strip() for g in a.group_by.split(",") if g.strip()]
    groups = group_runs(runs, group_by, metrics, a.last)
    command = "rlexp compare " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    print_table(groups, group_by, metrics, title=f"{a.name}: {len(runs)} runs, {len(groups)} groups", digits=a.digits)
    out = Path(a.out) if a.out else default_out(a.name)
    paths = write_outputs(groups, runs, group_by, metrics, out, a.name, command, a.last, a.smooth, a.digits)
    print(f"wrote {paths['markdown']}, {paths['csv']}, {paths['runs_csv']} and {len(paths['png'])} PNG curves in {out}")
    return paths
