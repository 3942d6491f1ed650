"""Faults on the shared-memory path: a peer killed mid-collective, leftovers, a full /dev/shm.

Each test points SCALEDL_SHM_DIR at a directory of its own, so "nothing of ours remains" can be
checked exactly.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from tests.harness import free_port, run_ranks

pytestmark = pytest.mark.distributed


def _spawned(rank: int, world: int, port: int, segdir: str, results: Any, mode: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), SCALEDL_SHM_DIR=segdir, SCALEDL_TIMEOUT="60")
    import scaledl

    scaledl.init()
    tensor = torch.ones(1 << 20)
    scaledl.allreduce(tensor, algorithm="shm")  # the group is open
    if mode == "kill" and rank == 1:
        results.put(("death", time.time()))
        results.close()
        results.join_thread()  # the message is out before the process dies
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise" and rank == 1:
        raise RuntimeError("user code failed")
    if mode == "sigterm" and rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    try:
        for _ in range(50):
            scaledl.allreduce(tensor, algorithm="shm")
        results.put(("done", rank))
    except Exception as error:  # the peer's death, named
        results.put(("error", time.time(), str(error)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(mode: str, segdir: Path, timeout: float = 60.0) -> list[tuple[Any, ...]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_spawned, args=(r, 2, port, str(segdir), results, mode))
             for r in range(2)]
    for proc in procs:
        proc.start()
    messages = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and any(p.is_alive() for p in procs):
            time.sleep(0.1)
        while not results.empty():
            messages.append(results.get())
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
    return messages


def test_a_peer_killed_mid_collective_is_named_within_two_seconds(tmp_path: Path) -> None:
    messages = _run("kill", tmp_path)
    death = next(m[1] for m in messages if m[0] == "death")
    error = next(m for m in messages if m[0] == "error")
    assert "rank 1" in error[2] and "died" in error[2], error
    assert error[1] - death < 2.0, error[1] - death
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", ["normal", "raise", "sigterm"])
def test_nothing_remains_after_exit_exception_or_sigterm(tmp_path: Path, mode: str) -> None:
    _run(mode, tmp_path)
    assert list(tmp_path.iterdir()) == []


_KILLED_IN_SETUP = """
import os, signal, sys
sys.path.insert(0, {src!r})
os.environ["SCALEDL_SHM_DIR"] = {segdir!r}
from scaledl.transport.shm_segment import Segment
Segment.create(0xabc, 0, 4096, 2, 5)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _leftover_then_job(rank: int, world: int, segdir: str) -> list[str]:
    os.environ["SCALEDL_SHM_DIR"] = segdir
    import scaledl

    scaledl.init()
    scaledl.allreduce(torch.ones(8), algorithm="shm")
    return sorted(os.listdir(segdir))


def test_a_killed_jobs_leftover_is_removed_by_the_next_job(tmp_path: Path) -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    code = _KILLED_IN_SETUP.format(src=src, segdir=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert len(list(tmp_path.iterdir())) == 1  # what a kill inside the set-up window leaves
    assert run_ranks(2, _leftover_then_job, str(tmp_path), timeout=60) == [[], []]


def _small_dir(rank: int, world: int, segdir: str) -> tuple[bool, list[str], bool, str]:
    os.environ["SCALEDL_SHM_DIR"] = segdir
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("scaledl").addHandler(Keep(logging.WARNING))
    import scaledl
    from scaledl.collectives.communicator import communicator_for

    scaledl.init()
    tensor = torch.full((1000,), float(rank + 1))
    scaledl.allreduce(tensor)
    choice = scaledl.explain("allreduce", 1000).splitlines()[0]
    return (communicator_for(None).shm is None, records, bool(torch.all(tensor == 3.0)), choice)


def test_a_too_small_segment_directory_falls_back_with_a_warning(tmp_path: Path) -> None:
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        results = run_ranks(2, _small_dir, str(small), timeout=60)
        for fallback, _, correct, choice in results:
            assert fallback and correct and choice != "auto chose shm:"
        warnings = [w for _, ws, _, _ in results for w in ws]
        assert any("enlarge it" in w and "--shm-size" in w for w in warnings), warnings
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)



def _mismatched(rank: int, world: int, case: int) -> str:
    """A call that differs between the ranks, on the shared-memory path (after a good one)."""
    import scaledl

    scaledl.allreduce(torch.ones(4), algorithm="shm")
    calls = [
        lambda: scaledl.allreduce(torch.ones(8 if rank == 0 else 6), algorithm="shm"),
        lambda: scaledl.allreduce(torch.ones(1 << 20 if rank == 0 else (1 << 19) + 5),
                                  algorithm="shm"),
        lambda: scaledl.allreduce(torch.ones(8), op="sum" if rank == 0 else "max",
                                  algorithm="shm"),
        lambda: scaledl.allreduce(torch.ones(4, dtype=torch.float16 if rank else torch.bfloat16),
                                  algorithm="shm"),
        lambda: scaledl.broadcast(torch.ones(4 if rank == 0 else 8), src=0, algorithm="shm"),
        lambda: scaledl.broadcast(torch.ones(8), src=rank, algorithm="shm"),
    ]
    try:
        calls[case]()
    except RuntimeError as error:
        return str(error)
    return "NO ERROR"


@pytest.mark.parametrize("case, named", [
    (0, "allreduce of 8 float32 (sum)"), (1, "allreduce of 1048576 float32"),
    (2, "allreduce of 8 float32 (max)"), (3, "allreduce of 4 bfloat16"),
    (4, "broadcast of 4 float32 (root 0)"), (5, "broadcast of 8 float32 (root 1)"),
])
def test_calls_that_differ_between_ranks_fail_named(case: int, named: str) -> None:
    # each was a silently wrong result: the ranks read each other's windows as if they matched
    messages = run_ranks(2, _mismatched, case, timeout=60, env={"SCALEDL_TIMEOUT": "20"})
    assert any(named in message for message in messages), messages
    for message in messages:
        assert "through shared memory; every rank of the group must make the same" in message \
            or "aborted the shared-memory collective" in message, messages
