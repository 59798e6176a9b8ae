"""The verdict language (``rlexp.reproduce``'s docstring): each requirement and check of a spec evaluated on the
per-seed values of the table, then the verdict on the claim."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from rlexp.reproduce.spec import Check

HELD = "held"
NOT_HELD = "did not hold"
NOT_TESTABLE = "not testable at this scale"
NOT_RUN = "not run yet"

PASS, FAIL, UNTESTABLE = "holds", "fails", "not testable"


@dataclass
class Values:
    """Per-seed values: ``final[(arm, metric)]`` each run's value (the mean of its last K logged values) and
    ``growth[(arm, metric)]`` each run's last-K mean over its first-K mean; a run that lacks the metric is absent."""

    final: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    growth: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def stat(self, arm: str, metric: str, growth: bool = False) -> tuple[float, float, int]:
        """Mean, sample std (0 for one value) and count over seeds; (nan, nan, 0) without values."""
        vals = [v for v in (self.growth if growth else self.final).get((arm, metric), []) if math.isfinite(v)]
        if not vals:
            return math.nan, math.nan, 0
        return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals)


@dataclass
class Outcome:
    check: Check
    status: str  # PASS | FAIL | UNTESTABLE
    value: float | None  # the compared quantity (ratio, difference, ...)
    ours: str  # the quantity in words with its numbers
    reason: str = ""  # why it is not testable

    def row(self) -> list[str]:
        c = self.check
        status = f"{self.status}: {self.reason}" if self.reason else self.status
        return [c.says or f"{c.metric} ({c.kind})", self.ours, c.bounds(), status]


@dataclass
class Verdict:
    result: str
    why: str
    requirements: list[Outcome]
    checks: list[Outcome]


def pooled_std(sa: float, sb: float) -> float:
    """The pooled std of two arms over seeds: sqrt((sa² + sb²) / 2)."""
    return math.sqrt((sa * sa + sb * sb) / 2)


def _f(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return (
        f"{x:.{digits}g}"
        if abs(x) >= 1000 or (x != 0 and abs(x) < 0.001)
        else f"{x:.{digits}f}".rstrip("0").rstrip(".")
    )


def evaluate_check(c: Check, values: Values) -> Outcome:
    """One requirement or check on the values."""
    growth = c.kind == "growth"
    ma, sa, na = values.stat(c.arm, c.metric, growth)
    if na == 0:
        what = "first and last values" if growth else "value"
        return Outcome(c, UNTESTABLE, None, "–", f"{c.metric} has no {what} for arm {c.arm}")
    if c.kind in ("value", "growth"):
        x = ma
        ours = f"{c.metric} {'growth (last/first) ' if growth else ''}of {c.arm} = {_f(ma)}"
        if na > 1:
            ours += f" ± {_f(sa)}"
    else:
        mb, sb, nb = values.stat(c.vs, c.metric)
        if nb == 0:
            return Outcome(c, UNTESTABLE, None, "–", f"{c.metric} has no value for arm {c.vs}")
        pair = f"{c.arm} {_f(ma)} vs {c.vs} {_f(mb)}"
        if c.kind == "ratio":
            if mb == 0:
                return Outcome(c, UNTESTABLE, None, pair, f"{c.metric} of {c.vs} is 0: no ratio")
            x = ma / mb
            ours = f"{c.metric} {c.arm} / {c.vs} = {_f(x)} ({pair})"
        elif c.kind == "difference":
            x = ma - mb
            ours = f"{c.metric} {c.arm} − {c.vs} = {_f(x)} ({pair})"
        else:  # difference_in_std, within_std: the std over seeds needs two seeds in each arm
            if na < 2 or nb < 2:
                few = c.arm if na < 2 else c.vs
                return Outcome(c, UNTESTABLE, None, pair, f"{c.metric}: a std over seeds needs ≥ 2 runs of {few}")
            s = pooled_std(sa, sb)
            d = ma - mb
            x = d / s if s > 0 else (0.0 if d == 0 else math.copysign(math.inf, d))
            if c.kind == "within_std":
                x = abs(x)
            ours = f"{c.metric} {c.arm} − {c.vs} = {_f(d)} = {_f(d / s if s > 0 else x)} std (std {_f(s)}; {pair})"
    if c.kind == "within_std":
        ok = x <= c.high
    else:
        ok = (c.low is None or x >= c.low) and (c.high is None or x <= c.high)
    return Outcome(c, PASS if ok else FAIL, x, ours)


def evaluate(requires: list[Check], checks: list[Check], values: Values) -> Verdict:
    req = [evaluate_check(c, values) for c in requires]
    out = [evaluate_check(c, values) for c in checks]
    for o in req:
        if o.status != PASS:
            needs = f"needs {o.check.says}" if o.check.says else f"needs {o.check.metric} {o.check.bounds()}"
            detail = o.reason or f"{o.ours}, not {o.check.bounds()}"
            return Verdict(NOT_TESTABLE, f"{needs} ({detail})", req, out)
    for o in out:
        if o.status == UNTESTABLE:
            return Verdict(NOT_TESTABLE, o.reason, req, out)
    failed = [o for o in out if o.status == FAIL]
    if not failed:
        return Verdict(HELD, "; ".join(_held(o) for o in out), req, out)
    return Verdict(NOT_HELD, "; ".join(f"{_label(o)}: {o.ours}, not {o.check.bounds()}" for o in failed), req, out)


def _label(o: Outcome) -> str:
    return o.check.says or f"{o.check.metric} ({o.check.kind})"


def _held(o: Outcome) -> str:
    return f"{_label(o)} ({o.ours})"
