"""The training progress bar with live reward/accuracy (``rlexp.core.progress.Bars``)."""

from __future__ import annotations

from rlexp.core.progress import Bars


class TrainProgress:
    """Live bar on a terminal; without one (logs, CI) a log line every ~5% of the steps instead."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True, description: str = "train"):
        self.enabled, self.total = enabled, total
        self.bars = Bars(enabled)
        self.task = self.bars.add(description, total, completed=start, unit=" steps")

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bars.__exit__(*exc)

    def update(self, step: int, metrics: dict) -> None:
        info = f"reward {metrics.get('reward/mean', float('nan')):.3f}"
        if "accuracy" in metrics:
            info += f"  acc {metrics['accuracy']:.3f}"
        if "eval/accuracy" in metrics:
            info += f"  eval {metrics['eval/accuracy']:.3f}"
        info += f"  len {metrics.get('length/mean', 0):.0f}  {metrics.get('time/step_s', 0):.1f}s/step"
        self.bars.update(self.task, step, info)
