"""What the trainer reports after every step, to whoever shows progress (the CLI draws a bar).

The trainer has no console of its own: it calls a :class:`StepProgress` on rank 0 when
``run.progress`` is on (the command line passes one that draws with rich); without a bar, rank 0
logs a line every ``run.log_every`` steps (:class:`LogProgress`), and the other ranks show
nothing (:class:`NoProgress`).
"""

from __future__ import annotations

import logging
from typing import Protocol

__all__ = ["StepProgress", "NoProgress", "LogProgress"]

log = logging.getLogger(__name__)


class StepProgress(Protocol):
    """Receives the training loop's progress: ``start``, one ``advance`` per step, ``stop``."""

    def start(self, total: int, done: int) -> None:
        """Training of ``total`` steps begins (or resumes) with ``done`` of them done."""
        ...

    def advance(self, loss: float, accuracy: float, samples_per_s: float) -> None:
        """One more step, with its loss, accuracy and the global throughput."""
        ...

    def stop(self) -> None:
        """Training ended (normally or by an error)."""
        ...


class NoProgress:
    """Shows nothing."""

    def start(self, total: int, done: int) -> None:
        """Nothing to show."""

    def advance(self, loss: float, accuracy: float, samples_per_s: float) -> None:
        """Nothing to show."""

    def stop(self) -> None:
        """Nothing to show."""


class LogProgress:
    """One log line every ``every`` steps (and at the last): the step, the loss, the accuracy
    and the throughput of that step."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"log_every {every} must be at least 1 step")
        self.every, self.total, self.done = every, 0, 0

    def start(self, total: int, done: int) -> None:
        """Counts from ``done`` of ``total``."""
        self.total, self.done = total, done

    def advance(self, loss: float, accuracy: float, samples_per_s: float) -> None:
        """Logs every ``every``-th step and the last."""
        self.done += 1
        if self.done % self.every == 0 or self.done == self.total:
            log.info("step %d/%d: loss %.4f, accuracy %.3f, %.0f samples/s", self.done,
                     self.total, loss, accuracy, samples_per_s)

    def stop(self) -> None:
        """Nothing more to log."""
