"""When to checkpoint: every N steps, every S seconds, at the end of every epoch.

Steps and epochs are the same on every worker, so those triggers need no agreement.  Seconds
are not: clocks and speeds differ, and for the strategies whose checkpoint is a collective
(every worker's state is gathered to rank 0) all workers must checkpoint at the same step.  So
rank 0 decides, and tells the others at *probe* steps only: at a probe every worker receives
rank 0's ``(due now, next probe step)``.  The next probe is half the steps rank 0 expects the
remaining time to take at its measured step rate (at least one step), so probes thin out
geometrically and cost a handful of tiny broadcasts per interval; the checkpoint is at most one
probe gap (about half the rate-estimated remainder, in practice a step or two) late.

With ``agree=None`` (one worker, or strategies where rank 0 alone checkpoints) the decision is
local and every step is a probe.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

__all__ = ["CheckpointSchedule"]

FIRST_PROBE_STEPS = 8
"""Steps after a checkpoint (or the start) before the first probe, to measure the step rate."""


class CheckpointSchedule:
    """Whether a checkpoint is due after a step (call :meth:`due` on every worker, every step)."""

    def __init__(self, every_steps: int | None, every_seconds: float | None,
                 agree: Callable[[torch.Tensor], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``agree(tensor)`` must broadcast rank 0's ``tensor`` to every worker in place."""
        self.every_steps = every_steps
        self.every_seconds = every_seconds if every_seconds else None
        self._agree = agree
        self._clock = clock
        self._since = clock()
        self._since_step = 0
        self._next_probe = 0

    def start(self, step: int) -> None:
        """Begin timing at ``step`` (the start, or the step resumed from)."""
        self.saved(step)

    def saved(self, step: int) -> None:
        """A checkpoint was taken after ``step`` (whatever triggered it): restart the clock."""
        self._since = self._clock()
        self._since_step = step
        self._next_probe = step + (FIRST_PROBE_STEPS if self._agree is not None else 1)

    def due(self, step: int) -> bool:
        """Whether to checkpoint after ``step`` (the number of steps done)."""
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        if self.every_seconds is None or step < self._next_probe:
            return False
        decision = torch.tensor(self._decide(step), dtype=torch.int64)
        if self._agree is not None:
            self._agree(decision)
        due, next_probe = bool(decision[0]), int(decision[1])
        self._next_probe = max(step + 1, next_probe)
        return due

    def _decide(self, step: int) -> list[int]:
        """Rank 0's view: ``[due, next probe step]``.  The gap to the next probe is half the
        steps the remaining time should take at the measured rate, at most the steps since the
        last checkpoint (so a slowdown is caught within a doubling), at least one."""
        assert self.every_seconds is not None
        elapsed = self._clock() - self._since
        if elapsed >= self.every_seconds:
            return [1, step + 1]
        if self._agree is None:
            return [0, step + 1]
        steps = max(1, step - self._since_step)
        remaining_steps = (self.every_seconds - elapsed) * steps / max(elapsed, 1e-9)
        return [0, step + max(1, min(steps, math.floor(remaining_steps / 2)))]
