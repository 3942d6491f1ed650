"""What a launch of local workers promises: its fault policy, how a job ended, and the
settings every launcher of :mod:`scaledl.launch` shares (grace periods, the store, the
environment the workers inherit).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scaledl.processes import die_with_parent
from scaledl.launchers import LAUNCH_ID_ENV

__all__ = [
    "FaultPolicy", "JobOutcome", "die_with_launcher", "launch_environment", "supported_options",
    "check_nproc", "INTERRUPTED", "SHUTDOWN_GRACE_S", "SHARED_STORE_ENV",
]

INTERRUPTED = 130
SHUTDOWN_GRACE_S = 5
"""Seconds a worker gets between SIGTERM and SIGKILL when the agent stops it on Ctrl-C or
SIGTERM (torch releases without the ``shutdown_timeout`` option give it their own default,
30 s).  When a worker fails, torch's agent stops the others with its own 30 s, which this
option does not reach: a worker that ignores SIGTERM then holds the launch 30 s."""
SHARED_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set to 1: every attempt's rank 0 hosts a fresh store for the workers.  torch's agent would
otherwise hand every attempt the same store, where a restarted worker finds the process-group
addresses of the attempt before it and connects to dead peers."""


@dataclass(frozen=True)
class FaultPolicy:
    """What a launch does when a worker fails."""

    max_restarts: int = 0
    """Restart every worker (from the last checkpoint) after a failure, up to this many times."""
    min_workers: int | None = None
    """Go on with fewer workers, down to this many, when one does not come back (elastic)."""
    drop_dead_workers: bool = False
    """A dead worker is dropped and the others go on (asynchronous strategies)."""
    essential_ranks: tuple[int, ...] = (0,)
    """Ranks whose death a job that drops dead workers cannot survive (rank 0, servers)."""


@dataclass(frozen=True)
class JobOutcome:
    """How a launched job ended."""

    code: int
    """0 when it finished; else the exit code of the first worker that failed (``128 + N``
    when signal ``N`` ended it), or 130 when interrupted."""
    rank: int | None = None
    """The first worker that failed, when one did."""
    cause: str = ""
    """``died (SIGKILL)``, ``exited with code 1``, ... (empty when it finished)."""
    dropped: tuple[int, ...] = ()
    """Workers that died and were dropped while the others finished."""


def supported_options(target: Callable[..., object], **options: Any) -> dict[str, Any]:
    """The ``options`` that ``target`` (a class or function of torch's elastic API) accepts.

    torch's elastic agent gains keywords between releases (``shutdown_timeout`` is in 2.13 and
    not in 2.11), and scaledl declares torch >= 2.8: an option the installed release lacks is
    left to that release's default instead of failing every launch.
    """
    parameters = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(options)
    return {name: value for name, value in options.items() if name in parameters}


def die_with_launcher() -> None:
    """In a process of a local launch (a worker, or a per-worker agent): be killed when the
    process that started it dies (Linux), so that a killed launcher leaves nothing running."""
    if LAUNCH_ID_ENV in os.environ:
        die_with_parent()


@contextlib.contextmanager
def launch_environment(updates: Mapping[str, str]) -> Iterator[None]:
    """Set ``updates`` in ``os.environ`` (which the agent hands to the workers) for the block."""
    saved = {name: os.environ.get(name) for name in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_nproc(nproc: int) -> None:
    """Refuse a worker count that is not a whole number >= 1."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--ranks {nproc!r} must be a whole number of processes >= 1")
