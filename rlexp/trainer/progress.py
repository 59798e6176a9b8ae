"""A rich progress bar with live reward/accuracy."""

from __future__ import annotations

import logging

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

log = logging.getLogger("rlexp.progress")


class TrainProgress:
    """Live bar on a terminal; without one (logs, CI) a log line every ~5% of the steps instead."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True, description: str = "train"):
        self.enabled, self.total = enabled, total
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        self.task = self.progress.add_task(description, total=total, completed=start, info="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def update(self, step: int, metrics: dict) -> None:
        info = f"reward {metrics.get('reward/mean', float('nan')):.3f}"
        if "accuracy" in metrics:
            info += f"  acc {metrics['accuracy']:.3f}"
        if "eval/accuracy" in metrics:
            info += f"  eval {metrics['eval/accuracy']:.3f}"
        info += f"  len {metrics.get('length/mean', 0):.0f}  {metrics.get('time/step_s', 0):.1f}s/step"
        self.progress.update(self.task, completed=step, info=info)
        if (
            self.enabled
            and not self.progress.console.is_terminal
            and (step % max(1, self.total // 20) == 0 or step == self.total)
        ):
            log.info("step %d/%d  %s", step, self.total, info)
