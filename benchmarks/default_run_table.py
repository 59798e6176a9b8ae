"""The table of issue 30's acceptance run (benchmarks/default_run_seeds.sh): for each seed, held-out greedy accuracy
at every evaluation (step 0 = the untrained policy), the gain, the last five steps' length / truncated share /
format / train accuracy, the wall time and peak memory from /usr/bin/time -v; then mean ± std over the seeds.

    python benchmarks/default_run_table.py results/learning/default_task/runs > results/learning/default_task/README.md
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def read_time(log: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS in GB from /usr/bin/time -v's report."""
    text = log.read_text(errors="replace")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text).group(1)
    seconds = sum(float(p) * 60**i for i, p in enumerate(reversed(wall.split(":"))))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return seconds, rss_kb / 1e6


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def main(runs: Path) -> None:
    out, starts, ends, gains, walls = [], [], [], [], []
    evals_at = None
    for run in sorted(p for p in runs.iterdir() if (p / "metrics.jsonl").exists()):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
        evals_at = evals_at or sorted(evals)
        steps = [r for r in rows if "length/mean" in r]
        last = steps[-5:]

        def avg(key, last=last):
            return sum(r[key] for r in last) / len(last)

        train_s = steps[-1]["time"] - rows[0]["time"]  # first logged row (step 0's evaluation) to the last step
        wall, rss = read_time(run / "time.log")
        start, end = evals[min(evals)], evals[max(evals)]
        starts.append(start), ends.append(end), gains.append(end - start), walls.append(wall)
        out.append(
            f"| {run.name} | {' → '.join(f'{evals[s]:.2f}' for s in sorted(evals))} | {end - start:+.2f} | "
            f"{avg('accuracy'):.2f} | {avg('reward/format/mean'):.2f} | {avg('length/mean'):.1f} | "
            f"{avg('length/truncated_frac'):.2f} | {statistics.median(r['time/step_s'] for r in steps):.1f} | "
            f"{train_s / 60:.1f} | {wall / 60:.1f} | {rss:.1f} |"
        )
    at = ", ".join(str(s) for s in evals_at or [])
    print("# The default run, three seeds (issue 30)\n")
    print("`bash benchmarks/default_run_seeds.sh` (`rlexp train trainer.seed=<s>`, nothing else), one seed after")
    print("the other on the 2-core CPU. Held-out: greedy accuracy on `eval.size` = 100 prompts of the seed's")
    print(f"held-out split, at steps {at}. Last 5: the mean of the last five steps.\n")
    print(
        "| seed | held-out accuracy | gain | train accuracy (last 5) | format (last 5) | length (last 5) | "
        "truncated (last 5) | median s/step | first eval → last step (min) | wall, process (min) | peak RSS (GB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(out))
    print(
        f"\nHeld-out accuracy at the start {mean_std(starts)}, at the end {mean_std(ends)}, gain {mean_std(gains)}; "
        f"wall time {statistics.mean(walls) / 60:.1f} min on average (process start to exit, model load and "
        "MLflow included)."
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
