"""Shared-memory collectives at several window (piece) sizes, interleaved in one job.

Run as ranks of one host, e.g.::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/peers/piece_size.py

A window is fixed when a group's shared memory opens (``SCALEDL_SHM_WINDOW_MB``), so the script
opens one group of every rank per window size (setting the variable before each), then times
``scaledl.allreduce(x, algorithm="shm", group=...)`` on each group in turn, round by round on
the same tensor, so that other load on the machine hits every window size alike.  Rank 0
prints, per message size, the median time per call for each window and its ratio to the
default (4 MiB).  ``--collective`` times reduce_scatter, allgather or broadcast instead (the
message size is the whole buffer: the reduce_scatter input, the allgather output).  A piece
streams through a window, so the window bounds the piece size: the
question is whether pieces small enough to stay in L2 (1 MiB per core here) between the copy in,
the reduction and the copy out beat the fewer waits of large ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import scaledl
from scaledl.transport.shm_open import WINDOW_ENV


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="4,1,0.25", help="window sizes, MiB (first: base)")
    parser.add_argument("--sizes", default="1,4,16,64", help="message sizes, MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.1,
                        help="seconds per sample (back-to-back calls)")
    parser.add_argument("--collective", default="allreduce",
                        choices=("allreduce", "reduce_scatter", "allgather", "broadcast"))
    args = parser.parse_args()
    scaledl.init(backend="gloo")
    if dist.get_world_size() < 2:  # plain `python` starts one rank, which times nothing shared
        raise SystemExit(f"{__file__} times ranks of one host against each other: run it "
                         "under torchrun --nproc-per-node 2 (or more), as its docstring shows")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    windows = [float(w) for w in args.windows.split(",")]
    groups = []
    for window in windows:
        os.environ[WINDOW_ENV] = str(window)
        group = dist.new_group(backend="gloo")
        scaledl.allreduce(torch.ones(1), algorithm="shm", group=group)  # opens its windows
        groups.append(group)
    if rank == 0:
        print(f"{args.collective} float32 on {world_size} ranks, medians of {args.rounds} "
              "interleaved "
              f"samples; window MiB: {', '.join(map(str, windows))}")
    for mib in (float(s) for s in args.sizes.split(",")):
        x = torch.ones(int(mib * (1 << 20)) // 4 // world_size * world_size)
        call = _call(args.collective, x, world_size)
        times: list[list[float]] = [[] for _ in windows]
        calls = []
        for group in groups:  # warm up, and how many calls fill a sample
            start = time.perf_counter()
            call(group)
            calls.append(time.perf_counter() - start)
        count = torch.tensor([max(1, int(args.seconds / max(min(calls), 1e-6)))])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        for _ in range(args.rounds):
            for index, group in enumerate(groups):
                x.zero_()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(int(count)):
                    call(group)
                times[index].append((time.perf_counter() - start) / int(count))
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            medians = [statistics.median(row) for row in slowest.tolist()]
            cells = [f"{w:g} MiB {m * 1e3:8.2f} ms ({medians[0] / m:.2f}x)"
                     for w, m in zip(windows, medians)]
            print(f"  {mib:g} MiB: " + "   ".join(cells))
    scaledl.shutdown()


def _call(collective: str, x: torch.Tensor, world_size: int) -> Callable[[object], None]:
    """One call of ``collective`` on the buffer ``x`` (its whole size), for a given group."""
    shard = x[:x.numel() // world_size].clone()
    if collective == "reduce_scatter":
        return lambda group: scaledl.reduce_scatter(shard, x, algorithm="shm", group=group)
    if collective == "allgather":
        return lambda group: scaledl.allgather(x, shard, algorithm="shm", group=group)
    if collective == "broadcast":
        return lambda group: scaledl.broadcast(x, algorithm="shm", group=group)
    return lambda group: scaledl.allreduce(x, algorithm="shm", group=group)


if __name__ == "__main__":
    main()
