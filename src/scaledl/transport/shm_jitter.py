"""Random delays at every step of the shared-memory protocol, to test it under skewed schedules.

A race between ranks shows only when one rank is late at the wrong moment: descheduled between
two control-word writes, or slow to read an arrival its peer is about to overwrite.  On an idle
machine that moment is rare (the arena deadlock of docs/algorithms.md took thousands of calls to
show), so tests make it common: with ``SCALEDL_SHM_JITTER=SEED:MAX_MS[:PROBABILITY]`` in the
environment, every :class:`~scaledl.transport.shm.ShmGroup` of the process sleeps a random
``0..MAX_MS`` milliseconds with the given probability (default 0.5) before and after every
control-word read and write and around every wait.  The draws are seeded by ``SEED`` and the
rank, so a failing schedule can be replayed.  Off (no variable), the protocol pays one
attribute test per step.

``benchmarks/reliability/shm_soak.py`` and ``tests/distributed/test_shm_jitter.py`` use it.
The parameter server's point-to-point wire (:mod:`scaledl.transport.direct`) draws its delays
from the same class, read from ``SCALEDL_WIRE_JITTER`` (``variable`` of
:meth:`Jitter.from_environment`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field

__all__ = ["Jitter", "JITTER_ENV"]

JITTER_ENV = "SCALEDL_SHM_JITTER"


@dataclass
class Jitter:
    """Seeded random delays; :meth:`pause` is called at every point of the protocol."""

    seed: int
    """Seed of the draws (the rank is mixed in, so ranks are late at different points)."""
    max_s: float
    """The longest delay, in seconds."""
    probability: float = 0.5
    """Chance that a point sleeps at all."""
    rank: int = 0
    variable: str = JITTER_ENV
    """The environment variable the setting came from (named in error messages)."""
    pauses: int = field(default=0, init=False)
    """Points passed so far."""
    slept_s: float = field(default=0.0, init=False)
    """Seconds slept so far."""
    _random: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.max_s < 0 or not 0 <= self.probability <= 1:
            raise ValueError(f"{self.variable}: a delay of {self.max_s * 1e3:g} ms with "
                             f"probability {self.probability:g} is not possible; give MAX_MS "
                             ">= 0 and a PROBABILITY in [0, 1]")
        self._random = random.Random(self.seed * 1_000_003 + self.rank)

    @classmethod
    def parse(cls, text: str, rank: int, variable: str = JITTER_ENV) -> Jitter:
        """``SEED:MAX_MS[:PROBABILITY]`` for ``rank`` (a ``ValueError`` naming ``variable`` and
        the text)."""
        fields = text.split(":")
        try:
            if len(fields) not in (2, 3):
                raise ValueError(text)
            probability = float(fields[2]) if len(fields) == 3 else 0.5
            return cls(int(fields[0]), float(fields[1]) / 1e3, probability, rank, variable)
        except ValueError as error:
            if str(error).startswith(variable):
                raise
            raise ValueError(f"{variable}={text!r} is not SEED:MAX_MS[:PROBABILITY]; write "
                             "e.g. 7:2 (seed 7, up to 2 ms at half the points)") from None

    @classmethod
    def from_environment(cls, rank: int, variable: str = JITTER_ENV) -> Jitter | None:
        """The jitter ``variable`` (default ``SCALEDL_SHM_JITTER``) asks for, or None when it is
        unset or empty."""
        text = os.environ.get(variable, "").strip()
        return cls.parse(text, rank, variable) if text else None

    def pause(self, point: str) -> None:
        """Maybe sleep at ``point`` (the name is for reading a trace; draws do not depend on it)."""
        with self._lock:  # the caller's thread and the communicator's worker share one stream
            self.pauses += 1
            delay = self._random.uniform(0, self.max_s) \
                if self._random.random() < self.probability else 0.0
            self.slept_s += delay
        if delay:
            time.sleep(delay)
