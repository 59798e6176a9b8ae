"""Step-for-step comparison of two runs' metrics.jsonl: every metric both runs log, at every step, must be
equal (bit for bit by default, or within --tol); timings, throughput and wall-clock stamps are skipped.
Metrics only one run logs are listed, not compared. Exit status 1 on any difference.

    python benchmarks/metrics_identity.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl [--tol 0]
"""

from __future__ import annotations

import argparse
import json
import sys

SKIP_PREFIXES = ("time/", "throughput/")
SKIP_KEYS = {"time", "step"}


def load(path: str) -> dict[int, dict]:
    rows = {}
    for line in open(path):
        rec = json.loads(line)
        rows[int(rec["step"])] = rec
    return rows


def compare(a: dict[int, dict], b: dict[int, dict], tol: float = 0.0) -> tuple[list[str], set[str], set[str], int]:
    diffs, only_a, only_b, compared = [], set(), set(), 0
    for step in sorted(set(a) | set(b)):
        if step not in a or step not in b:
            diffs.append(f"step {step}: logged by one run only")
            continue
        ka = {k for k in a[step] if k not in SKIP_KEYS and not k.startswith(SKIP_PREFIXES)}
        kb = {k for k in b[step] if k not in SKIP_KEYS and not k.startswith(SKIP_PREFIXES)}
        only_a |= ka - kb
        only_b |= kb - ka
        for k in sorted(ka & kb):
            x, y = a[step][k], b[step][k]
            compared += 1
            same = x == y if tol == 0 else abs(float(x) - float(y)) <= tol
            if not same:
                diffs.append(f"step {step} {k}: {x!r} != {y!r}")
    return diffs, only_a, only_b, compared


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tol", type=float, default=0.0)
    args = p.parse_args(argv)
    a, b = load(args.a), load(args.b)
    diffs, only_a, only_b, n = compare(a, b, args.tol)
    print(f"steps: {len(a)} vs {len(b)}; values compared: {n}; differences: {len(diffs)}")
    if only_a:
        print(f"only in {args.a}: {sorted(only_a)}")
    if only_b:
        print(f"only in {args.b}: {sorted(only_b)}")
    for d in diffs[:20]:
        print(d)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
