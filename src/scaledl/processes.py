"""Child processes: stop whole process groups, and turn termination signals into exceptions.

``scaledl train`` (through torch's launcher), ``scaledl bench algorithms`` (one training run per
method) and ``scaledl cluster run`` (one process per rank) start children in sessions of their
own, so that stopping one stops everything it started; these helpers do that the same way
everywhere: SIGTERM to the group, a grace period, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["stop_process_groups", "signals_raise"]


def stop_process_groups(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 10.0,
                        kill_grace_s: float = 5.0) -> None:
    """SIGTERM the process group of every running process in ``procs``; SIGKILL the groups of
    those still running after ``grace_s``; wait up to ``kill_grace_s`` for them to go."""
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_grace_s)):
        running = [proc for proc in procs if proc.poll() is None]
        if not running:
            return
        for proc in running:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + grace
        while any(proc.poll() is None for proc in running) and time.monotonic() < deadline:
            time.sleep(0.05)


@contextmanager
def signals_raise(make_error: Callable[[str], BaseException]) -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise ``make_error(signal name)`` so that ``finally``
    blocks run (tear-down, stopping children).  Only the main thread can handle signals; in
    another thread the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise make_error(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
