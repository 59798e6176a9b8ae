"""Progress with ETA for long loops (training steps, evaluation batches, sweep trials, conversions): live rich
bars on a terminal; elsewhere (log files, CI) a log line every ~5 % of a task, with elapsed and remaining time."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

log = logging.getLogger("rlexp.progress")


def clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class _Task:
    description: str
    total: int
    completed: int
    unit: str
    started: float = field(default_factory=time.perf_counter)
    start_count: int = 0
    next_log: int = 0


class Bars:
    """Several progress tasks in one live display. ``enabled=False`` shows nothing and logs nothing."""

    def __init__(self, enabled: bool = True, logger: logging.Logger | None = None, live: bool | None = None):
        """``live=False``: log lines even on a terminal (a caller whose inner work draws its own live bars)."""
        self.enabled, self.log = enabled, logger or log
        self.force_lines = live is False
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled or live is False,
        )
        self.tasks: dict[int, _Task] = {}

    @property
    def live(self) -> bool:
        return self.enabled and not self.force_lines and self.progress.console.is_terminal

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def add(self, description: str, total: int, completed: int = 0, unit: str = "") -> int:
        task = self.progress.add_task(description, total=total, completed=completed, info="")
        self.tasks[task] = _Task(description, total, completed, unit, start_count=completed)
        self.tasks[task].next_log = completed + self._log_every(total)
        return task

    def update(self, task: int, completed: int, info: str = "", description: str | None = None) -> None:
        t = self.tasks[task]
        t.completed = completed
        if description is not None:
            t.description = description
        fields = {"description": description} if description is not None else {}
        self.progress.update(task, completed=completed, info=info, **fields)
        if self.enabled and not self.live and (completed >= t.next_log or completed >= t.total):
            t.next_log = completed + self._log_every(t.total)
            self.log.info("%s %d/%d%s  %s%s", t.description, completed, t.total, t.unit, self.eta(t), info)

    def advance(self, task: int, n: int = 1, info: str = "") -> None:
        self.update(task, self.tasks[task].completed + n, info)

    def remove(self, task: int) -> None:
        self.progress.remove_task(task)
        self.tasks.pop(task, None)

    @staticmethod
    def _log_every(total: int) -> int:
        return max(1, total // 20)

    @staticmethod
    def eta(t: _Task) -> str:
        elapsed = time.perf_counter() - t.started
        done = t.completed - t.start_count
        if done <= 0 or t.completed >= t.total:
            return f"({clock(elapsed)} elapsed)  "
        return f"({clock(elapsed)} elapsed, ~{clock(elapsed / done * (t.total - t.completed))} left)  "
