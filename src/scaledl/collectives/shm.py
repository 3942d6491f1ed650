"""Shared memory: the whole collective among ranks of one host, through windows in ``/dev/shm``.

For a group whose ranks all run on one host (CPU tensors, Gloo).  The plan is a single stage
(:class:`~scaledl.collectives.schedule.Stage`) run by :mod:`scaledl.collectives.shm_ops`; no
byte goes through the kernel's network stack.  Steps, per piece of at most one window (4 MiB by
default, ``SCALEDL_SHM_WINDOW_MB``; allreduce streams in pieces of at most 2 MiB,
:data:`~scaledl.collectives.shm_ops.STREAM_BYTES`), for allreduce on ``L`` ranks:

1. every rank copies its piece into its own window and announces it (a large piece but for
   the rank's own part, which no peer reads);
2. a message of at most 1 MiB and a window, or a streamed message's last piece of at most half
   a piece (summed whole; :func:`~scaledl.collectives.shm_ops.allreduce_pieces` decides):
   every rank sums all windows in rank order straight into its buffer, so every rank holds
   identical bits; larger
   pieces: rank ``k`` sums part ``k`` of its buffer and of every peer's window into its own
   window and announces it, then every rank copies the ``L`` reduced parts out;
3. every rank announces that it has finished reading, which frees the windows for the piece
   after next (two windows per rank: copying in piece ``t+1`` overlaps reading piece ``t``).

reduce_scatter sums only its own part; allgather copies in its shard and out everyone's;
broadcast copies the root's window out; reduce leaves the reduced parts for the root alone.

Cost per rank for ``n`` bytes of allreduce: memory traffic of about ``3 n`` (copy in all but one
part, sum one part from the buffer and ``L - 1`` windows, copy out) and three waits per piece
(two, and in 4- and 8-byte types one copy, for what is summed whole), against
``2 (L-1)/L n`` through the TCP stack for a ring (each byte copied into a socket and out again
by the kernel).  Measured
on this project's 2-core machine in docs/benchmarks.md.

Sources: the shared-memory collectives of MPI libraries (MVAPICH2's and Open MPI's ``sm``/``vader``
components; Graham and Shipman, "MPI support for multi-core architectures: optimized shared
memory collectives", EuroPVM/MPI 2008), NCCL's SHM transport, and Gloo's shared-memory allreduce
(pytorch/gloo#458, 2025).
"""

from __future__ import annotations

from scaledl.collectives.schedule import Collective, Path, Schedule, Stage, join_rounds, stage_round
from scaledl.topology import Topology

__all__ = ["plan", "SUPPORTS"]

SUPPORTS = frozenset(Collective)
NEEDS_TOPOLOGY = False
NEEDS_SHM = True
"""Only for groups whose ranks share one host's memory."""


def plan(
    collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0
) -> Schedule:
    """One stage of the whole collective among every rank of the group, on shared memory."""
    p = topology.world_size
    whole = numel * p if collective in (Collective.REDUCE_SCATTER, Collective.ALLGATHER) else numel
    rooted = collective in (Collective.BROADCAST, Collective.REDUCE)
    stage = Stage(collective, tuple(range(p)), 0, whole, Path.SHM, 0, root if rooted else -1)
    return Schedule(collective, "shm", rank, p, whole, join_rounds([stage_round(stage)]))
