"""Allreduce streamed in pieces of each size, interleaved in one job, on 4 MiB windows.

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/peers/stream_piece.py

An allreduce above :func:`~scaledl.collectives.shm_ops.direct_limit` streams through the
windows in pieces of :data:`~scaledl.collectives.shm_ops.STREAM_BYTES`; this script sets that
constant to each of ``--pieces`` (MiB) in turn, round by round, and times
``scaledl.allreduce(x, algorithm="shm")`` (float32 SUM, back-to-back calls for about
``--seconds`` per sample after a barrier) at each message size of ``--sizes`` (MiB).  Rank 0
prints per size the median over ``--rounds`` rounds of rank 0's time per call for each piece
size and its speed relative to the first (> 1: faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import scaledl
from scaledl.collectives import shm_ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", default="4,1", help="piece sizes, MiB (first: base)")
    parser.add_argument("--sizes", default="1,4,16,64,256", help="message sizes, MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.1)
    args = parser.parse_args()
    scaledl.init(backend="gloo")
    if dist.get_world_size() < 2:  # plain `python` starts one rank, which times nothing shared
        raise SystemExit(f"{__file__} times ranks of one host against each other: run it "
                         "under torchrun --nproc-per-node 2 (or more), as its docstring shows")
    pieces = [int(float(text) * (1 << 20)) for text in args.pieces.split(",")]
    sizes = [int(float(text) * (1 << 20)) for text in args.sizes.split(",")]
    tensors = {nbytes: torch.zeros(nbytes // 4) for nbytes in sizes}
    times: dict[tuple[int, int], list[float]] = {}
    calls: dict[int, int] = {}
    for nbytes, x in tensors.items():
        start = time.perf_counter()
        scaledl.allreduce(x, algorithm="shm")
        once = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(once, op=dist.ReduceOp.MAX)
        calls[nbytes] = max(1, int(args.seconds / max(float(once), 1e-6)))
    for _ in range(args.rounds):
        for piece in pieces:
            shm_ops.STREAM_BYTES = piece
            for nbytes, x in tensors.items():
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls[nbytes]):
                    scaledl.allreduce(x, algorithm="shm")
                times.setdefault((nbytes, piece), []).append(
                    (time.perf_counter() - start) / calls[nbytes])
    if dist.get_rank() == 0:
        print(f"allreduce float32 on {dist.get_world_size()} ranks, medians of {args.rounds} "
              f"interleaved samples; piece MiB: {', '.join(args.pieces.split(','))}")
        for nbytes in sizes:
            base = statistics.median(times[(nbytes, pieces[0])])
            cells = []
            for piece in pieces:
                median = statistics.median(times[(nbytes, piece)])
                cells.append(f"{piece / (1 << 20):g} MiB {median * 1e3:8.3f} ms "
                             f"({base / median:.2f}x)")
            row = "  ".join(cells)
            print(f"  {nbytes / (1 << 20):g} MiB: {row}")
    scaledl.shutdown()


if __name__ == "__main__":
    main()
