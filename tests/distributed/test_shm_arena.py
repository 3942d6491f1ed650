"""Arenas (tensors that live in shared memory, reduced in place) beside the windowed path.

Regression tests for two defects found by users (../shared/repros/race_inplace.py, race_dp.py,
arena_leak.py): an arena allreduce overwrote the arrival word of a windowed piece its peer had
not read yet (a deadlock of DataParallel on any model whose buffers are all floating point), and
every DataParallel wrap mapped an arena that nothing unmapped.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import pytest
import torch

import scaledl
from scaledl.collectives.communicator import communicator_for
from scaledl.transport import shm as shm_module
from tests.harness import run_ranks
from tests.shm_schedules import _FloatBuffers

pytestmark = pytest.mark.distributed


def _late_reader(rank: int, p: int) -> list[float]:
    scaledl.init()
    arena = communicator_for(None).shared_buffers([1024], torch.float32)
    assert arena is not None
    if rank == 1:  # descheduled just before it looks for rank 0's broadcast data
        arrived = shm_module.ShmGroup.arrived

        def late(self: shm_module.ShmGroup, peer: int, count: int) -> int:
            time.sleep(0.3)
            return arrived(self, peer, count)
        shm_module.ShmGroup.arrived = late  # type: ignore[method-assign]
    seen = []
    for step in range(3):
        small = torch.full((16,), float(step) if rank == 0 else -1.0)
        scaledl.broadcast(small, src=0, algorithm="shm")
        arena[0].fill_(rank + 1)
        scaledl.allreduce(arena[0], algorithm="shm")
        seen += [small[0].item(), arena[0][0].item()]
    return seen


def test_arena_allreduce_after_a_broadcast_its_peer_reads_late() -> None:
    results = run_ranks(2, _late_reader, timeout=60, env={"SCALEDL_TIMEOUT": "10"})
    assert results == [[0.0, 3.0, 1.0, 3.0, 2.0, 3.0]] * 2


def _float_buffer_steps(rank: int, p: int) -> bool:
    scaledl.init()
    torch.manual_seed(0)
    model = scaledl.DataParallel(_FloatBuffers(), algorithm="auto")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(60):
        optimizer.zero_grad()
        model(torch.full((2, 8), float(rank + step % 3))).sum().backward()
        optimizer.step()
    weights = model.module.linear.weight.detach().clone()
    everyone = [torch.empty_like(weights) for _ in range(p)]
    torch.distributed.all_gather(everyone, weights)
    return all(torch.equal(weights, other) for other in everyone)


@pytest.mark.parametrize("world_size", [2, 3])
def test_data_parallel_on_a_model_with_only_float_buffers(world_size: int) -> None:
    assert run_ranks(world_size, _float_buffer_steps, timeout=90,
                     env={"SCALEDL_TIMEOUT": "10"}) == [True] * world_size


def _mapped() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if "/scaledl-" in line)


def _wrap_twenty_times(rank: int, p: int) -> list[tuple[int, int]]:
    scaledl.init()
    shm = communicator_for(None).shm
    assert shm is not None
    rows = []
    for _ in range(20):
        model = scaledl.DataParallel(torch.nn.Linear(256, 256), algorithm="shm")
        model(torch.randn(2, 256)).sum().backward()
        del model
        gc.collect()
        rows.append((_mapped(), shm.arenas))
    return rows


def test_arenas_are_unmapped_when_their_wrapper_is_gone() -> None:
    for rows in run_ranks(2, _wrap_twenty_times, timeout=90):
        assert {arenas for _, arenas in rows} == {0}
        assert len({mapped for mapped, _ in rows}) == 1, rows  # flat across 20 wraps
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("scaledl-")
                and f"-p{os.getpid()}" in name]


def _rank_0_exits_first(rank: int, p: int, on_error: bool) -> str:
    """Rank 0 closes its groups after one allreduce, as a rank does at exit (cleanly, having run
    out of batches one step early; or ``on_error``, after an uncaught exception); rank 1 then
    makes a second allreduce and returns its error."""
    scaledl.init()
    x = torch.ones(64)
    scaledl.allreduce(x, algorithm="shm")
    if rank == 0:
        if on_error:
            # what the interpreter does for an uncaught exception before the exit handlers
            # close the groups (checked for real by the last test)
            sys.last_value = ValueError("a bug in rank 0's script")
        try:
            scaledl.shutdown()
        finally:
            if on_error:
                del sys.last_value
        return "failed" if on_error else "left"
    started = time.monotonic()
    try:
        scaledl.allreduce(x, algorithm="shm")
    except Exception as error:  # noqa: BLE001 - the message is the result
        assert time.monotonic() - started < 2.0
        return str(error)
    return "no error"


def test_a_peer_that_left_is_named_as_such_not_as_dead() -> None:
    left, waiting = run_ranks(2, _rank_0_exits_first, False, timeout=60,
                              env={"SCALEDL_TIMEOUT": "30"})
    assert left == "left"
    assert "rank 0 left the group (it finished or shut down)" in waiting, waiting
    assert "different numbers of collective calls" in waiting


def test_a_peer_that_exited_on_an_error_is_named_as_such() -> None:
    failed, waiting = run_ranks(2, _rank_0_exits_first, True, timeout=60,
                                env={"SCALEDL_TIMEOUT": "30"})
    assert failed == "failed"
    assert "rank 0 exited after an error of its own" in waiting, waiting
    assert "different numbers" not in waiting


def test_the_interpreter_keeps_an_uncaught_error_for_the_exit_handlers() -> None:
    """What :func:`scaledl.transport.shm._exiting_on_error` reads at exit."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('seen', getattr(sys, 'last_value', None)))\n"
            "raise ValueError('uncaught')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 1 and "seen uncaught" in done.stdout, done
