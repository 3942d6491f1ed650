"""Child processes: stop whole process groups, and turn termination signals into exceptions.

``scaledl train`` (through torch's launcher), ``scaledl bench algorithms`` (one training run per
method) and ``scaledl cluster run`` (one process per rank) start children in sessions of their
own, so that stopping one stops everything it started; these helpers do that the same way
everywhere: SIGTERM to the group, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["stop_process_groups", "stop_groups", "signals_raise", "signals_blocked",
           "group_alive", "die_with_parent", "STOP_SIGNALS"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that ask a supervisor to stop (Ctrl-C, ``kill``, a closed terminal)."""


def stop_process_groups(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 10.0,
                        kill_grace_s: float = 5.0, include_finished: bool = False) -> None:
    """SIGTERM the process group of every running process in ``procs``; SIGKILL the groups of
    those still running after ``grace_s``; wait up to ``kill_grace_s`` for them to go.

    With ``include_finished`` the group of *every* process is signalled, also of those that have
    exited, so helpers left in a finished leader's group are stopped too; each group still gets
    the grace period while any of its members runs, then SIGKILL, sent to every group.
    """
    if include_finished:
        _stop_all_groups(procs, grace_s, kill_grace_s)
        return
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


def group_alive(pgid: int, own_session: bool = False) -> bool:
    """Whether a process that is not a zombie is still in process group ``pgid`` (Linux /proc);
    with ``own_session``, in the session of that number too: a group started as a session of
    its own, not another process that reuses the number of its long-gone leader."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X") and \
                (not own_session or fields[3] == str(pgid)):
            return True
    return False


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_all_groups(procs: Sequence[subprocess.Popen[bytes]], grace_s: float,
                     kill_grace_s: float) -> None:
    def leaders() -> bool:
        return any([proc.poll() is None for proc in procs])  # poll() also reaps exited ones

    stop_groups([proc.pid for proc in procs], grace_s, kill_grace_s, leaders)


def stop_groups(groups: Sequence[int], grace_s: float, kill_grace_s: float,
                running: Callable[[], bool] = lambda: False) -> None:
    """SIGTERM the process groups of ``groups`` (each started as a session of its own) that
    still have a member, SIGKILL those left after ``grace_s``, and wait up to ``kill_grace_s``
    for them to go: also the groups whose leader has exited, whose helpers it left behind.
    ``running`` (the leaders' own check, which also reaps them) keeps the grace going."""
    def alive() -> list[int]:
        return [pgid for pgid in groups if group_alive(pgid, own_session=True)]

    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_grace_s)):
        if not running() and not alive():
            return
        for pgid in alive():  # a group whose number is now another's is left alone
            _killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while (running() or alive()) and time.monotonic() < deadline:
            time.sleep(0.05)


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Be killed (SIGKILL) when the process that started this one dies, even by SIGKILL
    (Linux's ``PR_SET_PDEATHSIG``; it survives ``exec``); nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def signals_blocked(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[list[str]]:
    """Hold ``signals`` off inside the block, so a clean-up cannot be cut short.

    They are blocked with ``pthread_sigmask`` and, should another thread receive one, recorded
    by a handler that does nothing else.  The block yields a list that receives the names of the
    signals that arrived; they are consumed, so the caller decides what they mean.  Outside the
    main thread the block runs unchanged (the list stays empty).
    """
    arrived: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return

    def record(signum: int, frame: Any) -> None:
        arrived.append(signal.Signals(signum).name)

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    previous = {sig: signal.signal(sig, record) for sig in signals}
    try:
        yield arrived
    finally:
        while (info := signal.sigtimedwait(signals, 0)) is not None:
            arrived.append(signal.Signals(info.si_signo).name)
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


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
