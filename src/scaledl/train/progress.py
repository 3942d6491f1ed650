"""What the trainer reports after every step, to whoever shows progress (the CLI draws a bar).

The trainer has no console of its own: it calls a :class:`StepProgress` on rank 0 when
``run.progress`` is on (the command line passes one that draws with rich), and
:class:`NoProgress` otherwise.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["StepProgress", "NoProgress"]


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
