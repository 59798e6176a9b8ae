"""Runs grouped by identity except the seed, and each group's final values and curves over seeds (mean ± sample std)."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

from rlexp.comparison.runs import RunRecord, compile_patterns


@dataclass
class Group:
    key: tuple
    runs: list
    values: dict  # metric -> per-run values (None where a run lacks it)

    def stat(self, metric: str) -> tuple[float, float, int]:
        vals = [v for v in self.values[metric] if v is not None]
        if not vals:
            return math.nan, math.nan, 0
        return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals)

    @property
    def seeds(self) -> list[str]:
        return sorted({r.tags.get("seed", "?") for r in self.runs}, key=lambda s: (len(s), s))


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
    return [
        Group(k, rs, {m: [final_value(r.history.get(m, []), last) for r in rs] for m in metrics})
        for k, rs in sorted(groups.items())
    ]


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
        w = values[max(0, i - window + 1) : i + 1]
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
    rows = [
        [g.key[i] for i in cols] + [str(len(g.runs)), ", ".join(g.seeds)] + [fmt(*g.stat(m), digits) for m in metrics]
        for g in groups
    ]
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_")
