"""Where the microseconds of a small shared-memory allreduce go: the same call at six depths.

Run as 2 (or more) ranks on one host, e.g.::

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/peers/small_message.py --bytes 4096

Every rank makes the same back-to-back float32 SUM allreduces of ``--bytes``, entered at six
depths, the depths interleaved round by round so that load from elsewhere hits them alike:

- ``api``: ``scaledl.allreduce(x, algorithm="shm")``, the public call, which after its first
  call takes the direct path (:mod:`scaledl.collectives.shm_direct`);
- ``whole``: the same call with ``topology=`` given (not the argument the direct path was
  prepared with, None), which keeps it on the whole path (argument
  checks, the communicator's job, the cached plan, the stage, the protocol, AVG's finish): what
  every small allreduce cost before the direct path;
- ``direct``: the direct path's prepared call alone
  (:meth:`scaledl.collectives.shm_direct.DirectAllreduce.run`);
- ``stage``: the communicator's stage runner on the one shared-memory stage (the call word
  announced, the failure guard, the arena lookup, the protocol);
- ``protocol``: :func:`scaledl.collectives.shm_ops.allreduce` alone;
- ``floor``: what any Python implementation of the protocol must do: copy into the window,
  store the arrival word, spin until the peers' words arrive, sum, store the release word
  (no checks, no waits' bookkeeping; it is correct only for back-to-back calls of one size).

Differences between depths are the cost of each layer.  Rank 0 prints per depth the median
and the minimum over rounds of the mean time per call (the minimum is the least disturbed by
other load), the differences, and the CPU time of the call with the waits for the peers taken
out (``busy``: what this rank's own code costs per call, in ``time.thread_time``, which stops
while the rank is off its core, so it holds on a loaded machine; the waits timed by a wrapper
around :meth:`ShmGroup._wait` that only this script installs), and how the waits ended.
``--profile`` adds cProfile's table of the ``api`` depth on rank 0.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
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
from scaledl.collectives.registry import plan
from scaledl.collectives.shm_direct import DirectAllreduce
from scaledl.collectives.schedule import Collective
from scaledl.transport.shm import ARRIVED, RELEASED, SPINS, ShmGroup


def _floor(group: ShmGroup, members: list[int], x: torch.Tensor) -> Callable[[], None]:
    """The bare protocol on its own counters, for back-to-back calls of one size."""
    me = group.index
    peers = [peer for peer in members if peer != me]
    own = group._words[me]
    nbytes = x.numel() * 4
    mine = group._windows[me][0][:nbytes].numpy().view(np.float32)
    theirs = [group._windows[peer][0][:nbytes].numpy().view(np.float32) for peer in peers]
    arrived_out = [group._own_line(ARRIVED, peer, 0) for peer in peers]
    released_out = [group._own_line(RELEASED, peer) for peer in peers]
    arrived_in = [(group._words[peer], group._peer_line(peer, ARRIVED, 0)) for peer in peers]
    released_in = [(group._words[peer], group._peer_line(peer, RELEASED)) for peer in peers]
    out = x.numpy()
    first = 1 << 40  # far above the protocol's own counts
    state = {"count": first}

    def call() -> None:
        count = state["count"] = state["count"] + 1
        if count > first + 1:
            for words, line in released_in:  # the peers have read the previous piece
                while words[line] < count - 1:
                    pass
        np.copyto(mine, out)
        for line in arrived_out:
            own[line] = count
        for words, line in arrived_in:
            while words[line] != count:
                pass
        np.copyto(out, mine)
        for window in theirs:
            np.add(out, window, out=out)
        for line in released_out:
            own[line] = count

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=4096, help="message size (default 4096)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7)")
    parser.add_argument("--profile", action="store_true", help="cProfile the api depth")
    args = parser.parse_args()
    topology = scaledl.init(backend="gloo")
    if dist.get_world_size() < 2:  # plain `python` starts one rank, which times nothing shared
        raise SystemExit(f"{__file__} times ranks of one host against each other: run it "
                         "under torchrun --nproc-per-node 2 (or more), as its docstring shows")
    comm = communicator_for(None)
    group = comm.shm
    assert group is not None, "run the ranks on one host"
    x = torch.zeros(args.bytes // 4)
    numel = x.numel()
    schedule = plan("shm", Collective.ALLREDUCE, topology, topology.rank, numel)
    stage = schedule.rounds[0].stage
    assert stage is not None
    members = [group.local_index(member) for member in stage.members]
    scaledl.allreduce(x, algorithm="shm")  # the first call prepares the direct path
    direct = comm.direct.get(("shm", "sum", x.dtype, numel))
    assert isinstance(direct, DirectAllreduce), "the direct path was not prepared"
    depths: dict[str, Callable[[], object]] = {
        "api": lambda: scaledl.allreduce(x, algorithm="shm"),
        "whole": lambda: scaledl.allreduce(x, algorithm="shm", topology=topology),
        "direct": lambda: direct.run(x),
        "stage": lambda: comm.stages.run(stage, x, ReduceOp.SUM),
        "protocol": lambda: shm_ops.allreduce(group, members, x, 0, numel, ReduceOp.SUM),
    }
    waited = [0.0]
    original_wait = ShmGroup._wait

    def timed_wait(self: ShmGroup, *args: object, **kwargs: object) -> None:
        start = time.thread_time()
        try:
            original_wait(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            waited[0] += time.thread_time() - start

    ShmGroup._wait = timed_wait  # type: ignore[method-assign]
    results: dict[str, list[float]] = {name: [] for name in [*depths, "floor"]}
    busy: dict[str, list[float]] = {name: [] for name in depths}
    for call in depths.values():
        for _ in range(200):
            call()
    for _ in range(args.rounds):
        for name, call in depths.items():
            dist.barrier()
            waited[0] = 0.0
            start, cpu = time.perf_counter(), time.thread_time()
            for _ in range(args.calls):
                call()
            elapsed, used = time.perf_counter() - start, time.thread_time() - cpu
            results[name].append(elapsed / args.calls)
            busy[name].append((used - waited[0]) / args.calls)
        # the floor runs on its own counters; the window it uses is free once every rank
        # finished the depths above (a barrier), and left free after it (another)
        dist.barrier()
        floor = _floor(group, members, x)
        start = time.perf_counter()
        for _ in range(args.calls):
            floor()
        results["floor"].append((time.perf_counter() - start) / args.calls)
        dist.barrier()
        _restore(group, members)
    slowest = {name: _max_over_ranks(times) for name, times in results.items()}
    if topology.rank == 0:
        print(f"{args.bytes} B allreduce on {topology.world_size} ranks, {args.rounds} rounds of "
              f"{args.calls} calls (microseconds per call, slowest rank)")
        previous = None
        for name, times in slowest.items():
            median, low = statistics.median(times) * 1e6, min(times) * 1e6
            line = f"  {name:9s} median {median:7.1f}   min {low:7.1f}"
            if previous is not None:
                line += f"   vs the row above: {previous - median:+.1f} (median)"
            print(line)
            previous = median
        for name, times in busy.items():
            print(f"  {name:9s} busy (CPU time, waits taken out, this rank): median "
                  f"{statistics.median(times) * 1e6:7.1f}   min {min(times) * 1e6:7.1f}")
    waits = group.waits
    counts = _max_over_ranks([waits.ready, waits.spun, waits.yielded, waits.napped,
                              waits.yield_seconds, waits.nap_seconds])
    if topology.rank == 0:
        total = sum(counts[:4]) or 1
        print(f"waits (all depths, the busier rank): {counts[0] / total:.1%} ready at the first "
              f"look, {counts[1] / total:.1%} within {SPINS} spins, {counts[2] / total:.1%} while "
              f"yielding (mean {counts[4] / max(counts[2], 1) * 1e6:.0f} us), "
              f"{counts[3] / total:.1%} after naps (mean "
              f"{counts[5] / max(counts[3], 1) * 1e6:.0f} us)")
    if args.profile and topology.rank == 0:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            depths["api"]()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    elif args.profile:
        for _ in range(args.calls):
            depths["api"]()
    scaledl.shutdown()


def _restore(group: ShmGroup, members: list[int]) -> None:
    """Put back this rank's release words, which the floor raised to its own (huge) counts: the
    protocol's peers would take every later window for released.  (Arrival words are compared
    for equality, and the floor's counts never equal the protocol's.)"""
    own = group._words[group.index]
    for peer in members:
        if peer != group.index:
            own[group._own_line(RELEASED, peer)] = group._pair[peer]
    dist.barrier()


def _max_over_ranks(times: list[float]) -> list[float]:
    tensor = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


if __name__ == "__main__":
    main()
