"""A rich progress bar with live reward/accuracy."""
from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainProgress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, description: str = "train"):
        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 disable=not enabled)
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
