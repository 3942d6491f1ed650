"""The training progress bar of ``scaledl train``: steps done, loss, accuracy, samples/s."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.progress import TaskID

__all__ = ["RichProgress"]


class RichProgress:
    """A :class:`~scaledl.train.progress.StepProgress` drawn with rich on rank 0."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, total: int, done: int) -> None:
        """Draw the bar at ``done`` of ``total`` steps."""
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  acc {task.fields[acc]:.3f}  "
                       "{task.fields[rate]:,.0f} samples/s"),
            TimeElapsedColumn(),
        )
        self._task = self._progress.add_task("train", total=total, completed=done,
                                             loss=float("nan"), acc=0.0, rate=0.0)
        self._progress.start()

    def advance(self, loss: float, accuracy: float, samples_per_s: float) -> None:
        """One more step."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, loss=loss, acc=accuracy,
                                  rate=samples_per_s)

    def stop(self) -> None:
        """Remove nothing; leave the finished bar on screen."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
