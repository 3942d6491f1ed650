"""Mid-size shared-memory allreduce (64 KiB-2 MiB): the one-piece protocol against the split one,
and where the split one's time goes, interleaved in one job.

Run as ranks of one host, e.g.::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/paths/mid_size.py

Per message size every rank times back-to-back float32 SUM allreduces of one tensor through
three protocols, round by round so that load from elsewhere hits them alike:

- ``split``: the split protocol (the call announced, then the split piece of
  :mod:`scaledl.collectives.shm_ops`: copy in all but one's own part, reduce one's part from the
  buffer and the peers' windows into one's window, copy every reduced part out; three waits),
  which ``scaledl.allreduce`` ran above 64 KiB before this script's measurements moved the limit
  (``shm_ops.DIRECT_BYTES``) to 1 MiB;
- ``whole``: the one-piece protocol of small messages at this size
  (:func:`scaledl.collectives.shm_ops.fold_piece`: copy in, every rank sums every window into
  its buffer; two waits, ``(L - 1)`` more reads of ``n`` per rank);
- ``passes``: the split protocol's memory passes alone on private buffers (copy in a part,
  one ufunc pass reducing a part, copy out every part), no waits and no peer: the floor of its
  data movement on this core.

Rank 0 prints per size the median over rounds of the slowest rank's mean time per call, and how
the waits ended for each protocol (the spin/yield/nap schedule's evidence).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

import scaledl
from scaledl.collectives import shm_ops
from scaledl.collectives.communicator import communicator_for
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective
from scaledl.collectives.shm_calls import call_word, describe
from scaledl.transport.shm import ShmGroup, WaitCounts


def _protocols(group: ShmGroup, members: list[int], x: torch.Tensor
               ) -> dict[str, Callable[[], None]]:
    numel = x.numel()
    word = call_word(Collective.ALLREDUCE, numel, x.dtype, ReduceOp.SUM, -1)
    out = x.numpy()
    piece = group.small_piece(members, np.dtype(np.float32), numel)

    def named(other: int) -> str:
        return describe(other, group)

    def split() -> None:
        group.announce(members, word, named)
        shm_ops.split_piece(group, piece, out, np.add)

    out = x.numpy()
    piece = group.small_piece(members, np.dtype(np.float32), numel)

    def whole() -> None:
        shm_ops.fold_piece(group, piece, out, np.add, word, named)

    parts = len(members)
    own = numel // parts
    window = np.empty(numel, np.float32)
    peer = np.ones(numel, np.float32)

    def passes() -> None:
        np.copyto(window[own:], out[own:])
        np.add(out[:own], peer[:own], out=window[:own])
        np.copyto(out, window)

    return {"split": split, "whole": whole, "passes": passes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,128,256,512,1024,2048", help="KiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.05, help="seconds per sample")
    args = parser.parse_args()
    topology = scaledl.init(backend="gloo")
    if dist.get_world_size() < 2:  # plain `python` starts one rank, which times nothing shared
        raise SystemExit(f"{__file__} times ranks of one host against each other: run it "
                         "under torchrun --nproc-per-node 2 (or more), as its docstring shows")
    comm = communicator_for(None)
    group = comm.shm
    assert group is not None, "run the ranks on one host"
    members = [group.local_index(rank) for rank in range(topology.world_size)]
    rows = []
    for kib in (int(size) for size in args.sizes.split(",")):
        x = torch.ones(kib * 256)
        if kib * 1024 > group.window:
            continue
        protocols = _protocols(group, members, x)
        times: dict[str, list[float]] = {name: [] for name in protocols}
        waits: dict[str, WaitCounts] = {name: WaitCounts() for name in protocols}
        calls = 10
        for run in protocols.values():  # warm up, and agree on a call count
            for _ in range(calls):
                run()
        start = time.perf_counter()
        for _ in range(calls):
            protocols["split"]()
        per_call = (time.perf_counter() - start) / calls
        count = torch.tensor([max(5, int(args.seconds / max(per_call, 1e-6)))])
        dist.all_reduce(count, op=dist.ReduceOp.MIN)
        calls = int(count.item())
        for _ in range(args.rounds):
            for name, run in protocols.items():
                dist.barrier()
                before = WaitCounts(**vars(group.waits))
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                times[name].append((time.perf_counter() - start) / calls)
                after = group.waits
                for field in vars(after):
                    setattr(waits[name], field, getattr(waits[name], field)
                            + getattr(after, field) - getattr(before, field))
        slowest = {name: _max_over_ranks(values) for name, values in times.items()}
        rows.append((kib, {name: statistics.median(v) * 1e6 for name, v in slowest.items()},
                     waits))
    if topology.rank == 0:
        print(f"float32 SUM allreduce on {topology.world_size} ranks, {args.rounds} rounds, "
              "microseconds per call (median of rounds, slowest rank)")
        print("| size | split | whole | whole/split | passes (no waits) |")
        print("|---|---|---|---|---|")
        for kib, medians, _ in rows:
            print(f"| {kib} KiB | {medians['split']:.1f} | {medians['whole']:.1f} | "
                  f"{medians['whole'] / medians['split']:.2f} | {medians['passes']:.1f} |")
        print("waits of rank 0 (ready at first look / within spins / yielding / napping):")
        for kib, _, waits in rows:
            print(f"  {kib} KiB: " + "; ".join(
                f"{name} {w.ready}/{w.spun}/{w.yielded}/{w.napped}"
                for name, w in waits.items() if name != "passes"))
    scaledl.shutdown()


def _max_over_ranks(values: list[float]) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


if __name__ == "__main__":
    main()
