"""How long a wait should spin before it yields: the same allreduces with 200, 20 and 0 spins.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 benchmarks/paths/wait_spins.py [BYTES ...]

Every rank makes back-to-back float32 SUM ``scaledl.allreduce(x, algorithm="shm")`` calls of
each size (default 4 KiB and 64 KiB), 400 per sample after a barrier, with the shared-memory
group's :attr:`~scaledl.transport.shm.ShmGroup.spins` set to each value in turn, the values
interleaved round by round (7 rounds) so that load from elsewhere hits them alike.  Rank 0
prints per (spins, size) the median and the minimum over rounds of rank 0's mean time per call
in microseconds.  Run it with more ranks than cores (4 on this project's 2-core machine) and
with a core per rank (2) to see both sides of :func:`~scaledl.transport.shm.spins_for`.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

import scaledl
from scaledl.collectives.communicator import communicator_for

SPINS = (200, 20, 0)
CALLS = 400
ROUNDS = 7


def main() -> None:
    scaledl.init(backend="gloo")
    if dist.get_world_size() < 2:  # plain `python` starts one rank, which times nothing shared
        raise SystemExit(f"{__file__} times ranks of one host against each other: run it "
                         "under torchrun --nproc-per-node 2 (or more), as its docstring shows")
    group = communicator_for(None).shm
    assert group is not None, "run the ranks on one host"
    sizes = [int(arg) for arg in sys.argv[1:]] or [4096, 65536]
    tensors = {nbytes: torch.zeros(nbytes // 4) for nbytes in sizes}
    for x in tensors.values():
        scaledl.allreduce(x, algorithm="shm")  # the first call prepares the direct path
    times: dict[tuple[int, int], list[float]] = {}
    for _ in range(ROUNDS):
        for spins in SPINS:
            group.spins = spins
            for nbytes, x in tensors.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(CALLS):
                    scaledl.allreduce(x, algorithm="shm")
                times.setdefault((spins, nbytes), []).append(
                    (time.perf_counter() - start) / CALLS * 1e6)
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks, {len(group.peers)} on this host; microseconds "
              "per call, median [min] of rounds")
        for (spins, nbytes), values in sorted(times.items()):
            print(f"spins {spins:3d}  {nbytes:>8} B  {statistics.median(values):8.1f} "
                  f"[{min(values):.1f}]")
    scaledl.shutdown()


if __name__ == "__main__":
    main()
