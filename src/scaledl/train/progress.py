"""Rank 0's progress bar: steps done, loss, accuracy and samples/s, drawn with rich."""

from __future__ import annotations

from types import TracebackType

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["ProgressDisplay"]


class ProgressDisplay:
    """A rich progress bar when ``enabled`` (rank 0 on a terminal), else nothing."""

    def __init__(self, enabled: bool, total: int, done: int = 0) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task = None
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]:.4f}  acc {task.fields[acc]:.3f}  "
                           "{task.fields[rate]:,.0f} samples/s"),
                TimeElapsedColumn(),
            )
            self._task = self._progress.add_task("train", total=total, completed=done,
                                                 loss=float("nan"), acc=0.0, rate=0.0)

    def __enter__(self) -> ProgressDisplay:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, loss: float, accuracy: float, samples_per_s: float) -> None:
        """One more step."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, loss=loss, acc=accuracy,
                                  rate=samples_per_s)
