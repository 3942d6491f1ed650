"""``run_ranks``: run a function on N real processes joined by a Gloo process group.

Each rank is a fresh process with its own Gloo group on loopback (a fresh TCP port per call).
The parent collects every rank's return value, re-raises the first worker exception with its rank
and traceback, and kills everything after a hard timeout so a hang fails fast.

Ranks are forked from multiprocessing's fork server, which imports torch once per test session
(``spawn`` would import it in every rank: about 4-5 s of a 4-rank call on the 2-core VM, against
0.1 s forked).  The server is single-threaded, so the fork is safe, and each rank starts with the
parent's environment as it is at the call (not the server's, which is the one it started with),
as a spawned rank would: tests set variables with ``monkeypatch`` before calling.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.multiprocessing as mp

GROUP_TIMEOUT_S = 30.0

PRELOAD = ["torch", "torch.distributed", "torch._dynamo"]
"""What the fork server imports once for every rank (not scaledl: a rank imports it fresh).
``torch._dynamo`` is what a rank's first optimizer imports (about 1.2 s idle, 7-10 s on a loaded
machine, in every rank); it starts no thread, so forking after it is safe."""

_context: Any = None


def _forkserver() -> Any:
    """The fork server's context, its preload set on first use."""
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


class RankFailure(AssertionError):
    """A worker rank raised; the message carries its rank and traceback."""


def free_port() -> int:
    """An unused TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(
    rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...],
    results: Any, env: dict[str, str],
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.clear()  # the parent's environment at the call, not the fork server's
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=GROUP_TIMEOUT_S)
        )
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # reported to the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def _check_alive(
    procs: list[Any], values: dict[int, Any], deadline: float, timeout: float
) -> None:
    for rank, proc in enumerate(procs):
        if rank not in values and proc.exitcode is not None:
            raise RankFailure(f"rank {rank} died with exit code {proc.exitcode} before reporting")
    if time.monotonic() > deadline:
        missing = sorted(set(range(len(procs))) - set(values))
        raise RankFailure(f"ranks {missing} did not finish within {timeout} s")


def run_ranks(
    world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return values by rank."""
    ctx = _forkserver()
    results = ctx.Queue()
    port = free_port()
    environment = {**os.environ, **(env or {})}
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, fn, args, results, environment),
                    daemon=True)
        for r in range(world_size)
    ]
    for proc in procs:
        proc.start()
    values: dict[int, Any] = {}
    failures: list[str] = []
    deadline = time.monotonic() + timeout
    finished = False  # every rank reported a value: give them time to leave their group
    try:
        while len(values) < world_size and not failures:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                _check_alive(procs, values, deadline, timeout)
                continue
            if ok:
                values[rank] = value
            else:
                failures.append(f"rank {rank} failed:\n{value}")
        finished = not failures
    finally:
        for proc in procs:
            proc.join(timeout=5.0 if finished else 0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
    if failures:
        raise RankFailure("\n".join(failures))
    return [values[r] for r in range(world_size)]
