"""Host shares: a bucket reduced exactly inside each host, one owner per share, the owners'
peers across hosts, and the result handed back inside the host (BlueConnect's split of an
allreduce by level, used by PowerSGD to compress only what crosses hosts).

On ``N`` hosts of ``L`` ranks each, a bucket's flat buffer is cut into ``L`` contiguous shares
at gradient boundaries, share ``k`` owned by local rank ``k`` of every host.  Per bucket:

1. **reduce to owners** (inside each host): for every share, a reduce of its slice over the
   host's ranks into its owner; afterwards the owner holds its share summed over its host;
2. **across hosts**: each owner works on its share only, with the owners of the same share on
   the other hosts (the ranks of its local rank, a ring among them); what it sends there is
   its business (PowerSGD sends ``P`` and ``Q``; :func:`share_bounds` balances the shares by
   the work the owner will do on them);
3. **gather from owners** (inside each host): every owner's result to the host's other ranks:
   the share itself, or (as PowerSGD does) only what the owner sent across hosts, from which
   every rank rebuilds the share.

Step 1 moves the whole bucket inside the host (shared memory where the host's ranks share
it, else the backend's own collective on the host's ranks, else a ring of point-to-point
transfers with one uneven block per rank); step 2 moves only what the owners send.  Every
step is a schedule of scaledl's collectives (:mod:`scaledl.collectives.schedule`), run by the
group's executor on the communicator's job thread, planned once per bucket layout.

Cost: inside a host, a reduce-scatter of ``n`` elements (shared memory: each rank copies its
bucket in and sums its share from the others', about 3.5 memory passes per element with two
ranks) and the gather of step 3; across hosts, what step 2 sends, from ``L`` owners at once.

Source: Cho et al., "BlueConnect: Decomposing All-Reduce for Deep Learning on Heterogeneous
Network Hierarchy", SysML 2019 (one stage per level, each on its own fabric); the PowerAI DDL
paper (Cho et al., arXiv:1708.02188) for the same split on GPU hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from scaledl.collectives.communicator import Communicator
from scaledl.collectives.executor import execute
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.ring import allgather_rounds, reduce_scatter_rounds
from scaledl.collectives.schedule import (
    Collective, Path, Round, Schedule, Stage, join_rounds, split, stage_round,
)
from scaledl.topology import Topology

__all__ = ["HostShares", "share_bounds"]

Bounds = tuple[tuple[int, int], ...]
"""One ``[lo, hi)`` per local rank, contiguous from 0 to the buffer's end."""


def share_bounds(starts: Sequence[int], costs: Sequence[float], end: int,
                 parts: int) -> Bounds:
    """Cut ``[0, end)`` into ``parts`` contiguous shares at gradient starts (``starts``,
    ascending, the first 0), each as close as the cut points allow to ``1/parts`` of the total
    of ``costs`` (one per gradient; what follows the last gradient goes with it).  Each cut is
    the gradient start whose cost before it is nearest its target, never before the previous
    cut: deterministic, so every rank computes the same shares.  Shares may be empty."""
    if parts < 1:
        raise ValueError(f"cannot cut a bucket into {parts} shares")
    if len(starts) != len(costs):
        raise ValueError(f"{len(starts)} gradient starts but {len(costs)} costs")
    before = [0.0]
    for cost in costs:
        before.append(before[-1] + cost)
    total = before[-1]
    cuts = [0]
    index = 0  # cut k lies at gradient index >= the previous cut's
    for k in range(1, parts):
        target = total * k / parts
        while index < len(starts) and abs(before[index + 1] - target) < abs(before[index]
                                                                          - target):
            index += 1
        cuts.append(starts[index] if index < len(starts) else end)
    cuts.append(end)
    return tuple((cuts[k], max(cuts[k], cuts[k + 1])) for k in range(parts))


class HostShares:
    """Steps 1-3 of the module docstring for one rank of a group laid out as ``topology``."""

    def __init__(self, comm: Communicator, topology: Topology) -> None:
        rank = comm.rank
        self.comm = comm
        self.world_size = comm.world_size
        """Ranks in the group (``L * N``)."""
        self.host = topology.node_ranks(topology.node(rank))
        """The ranks of this rank's host, by local rank."""
        self.local_rank = topology.local_rank(rank)
        """Which share this rank owns."""
        self.across = tuple(topology.node_ranks(node)[self.local_rank]
                            for node in range(topology.num_nodes))
        """The owners of the same share on every host, by host."""
        self.path: Path | None = None
        """How the host's stages run: shared memory, the backend's own collective, or (None)
        a ring of point-to-point transfers."""
        if comm.shm is not None and comm.fabric.shares_memory(self.host):
            self.path = Path.SHM
        elif comm.fabric.native_stages:
            self.path = Path.NATIVE
        self._schedules: dict[tuple[object, ...], Schedule] = {}

    @property
    def ranks_per_host(self) -> int:
        """``L``: shares per bucket."""
        return len(self.host)

    @property
    def hosts(self) -> int:
        """``N``: ranks each owner works with across hosts, itself included."""
        return len(self.across)

    def describe(self) -> str:
        """One line: the layout and the paths of each level."""
        inside = self.path.value if self.path is not None else "ring"
        return (f"{self.hosts} hosts x {self.ranks_per_host} ranks: exact inside each host "
                f"({inside}), each rank's share across hosts (ring of {self.hosts})")

    def reduce_to_owners(self, buffer: torch.Tensor, bounds: Bounds) -> None:
        """Step 1: every share of ``buffer`` summed over the host into its owner (the other
        ranks' copies of that share are left undefined)."""
        self._run(("reduce", bounds, buffer.numel()), buffer, lambda: self._host_rounds(
            Collective.REDUCE_SCATTER, bounds))

    def gather_from_owners(self, buffer: torch.Tensor, bounds: Bounds) -> None:
        """Step 3: every share of ``buffer`` (the bucket, or what the owners sent across,
        cut the same way as ``bounds``) from its owner to the host's other ranks."""
        self._run(("gather", bounds, buffer.numel()), buffer, lambda: self._host_rounds(
            Collective.ALLGATHER, bounds))

    def allreduce_across(self, tensor: torch.Tensor) -> None:
        """Step 2's collective: sum the flat ``tensor`` over this rank's peers across hosts
        (a ring among them; every peer passes a tensor of the same length)."""
        numel = tensor.numel()

        def rounds() -> list[Round | None]:
            blocks = split(0, numel, self.hosts)
            rank = self.comm.rank
            return (reduce_scatter_rounds(self.across, rank, blocks)
                    + allgather_rounds(self.across, rank, blocks))
        self._run(("across", numel), tensor, rounds)

    def _host_rounds(self, collective: Collective, bounds: Bounds) -> list[Round | None]:
        """A reduce-scatter (or allgather) inside the host with one uneven block per rank.

        Point-to-point: a ring over the blocks as they are.  A stage path cuts its slice
        evenly, so with two ranks the even stage covers the widest stretch centred on the
        cut (``[c - d, c + d)``) and the rest goes to (or from) its owner alone, a reduce
        (or broadcast) stage; with more ranks each share is a reduce (or broadcast) stage."""
        rank, host = self.comm.rank, self.host
        scatter = collective is Collective.REDUCE_SCATTER
        if self.path is None:
            if scatter:
                return reduce_scatter_rounds(host, rank, bounds)
            return allgather_rounds(host, rank, bounds)
        rooted = Collective.REDUCE if scatter else Collective.BROADCAST
        owned = list(zip(host, bounds))
        rounds = list[Round | None]()
        if len(host) == 2:
            start, cut, end = bounds[0][0], bounds[0][1], bounds[1][1]
            width = min(cut - start, end - cut)
            rounds.append(stage_round(Stage(collective, host, cut - width, cut + width,
                                            self.path, 0)))
            owned = [(host[0], (start, cut - width)), (host[1], (cut + width, end))]
        for owner, (lo, hi) in owned:
            rounds.append(stage_round(Stage(rooted, host, lo, hi, self.path, 0, owner)))
        return rounds

    def _run(self, key: tuple[object, ...], buffer: torch.Tensor,
             rounds: Callable[[], list[Round | None]]) -> None:
        """Run the schedule cached under ``key`` (planned by ``rounds()`` the first time) on
        the flat ``buffer``, inline: call only from inside a communicator job."""
        schedule = self._schedules.get(key)
        if schedule is None:
            collective = Collective.ALLREDUCE if key[0] == "across" else (
                Collective.REDUCE_SCATTER if key[0] == "reduce" else Collective.ALLGATHER)
            schedule = Schedule(collective, f"host_shares.{key[0]}", self.comm.rank,
                                self.world_size, buffer.numel(), join_rounds(rounds()))
            schedule.validate()
            self._schedules[key] = schedule
        if not schedule.rounds:
            return
        assert buffer.dim() == 1 and buffer.is_contiguous(), "a flat working buffer"
        comm = self.comm
        execute(schedule, buffer, comm.transport, ReduceOp.SUM,
                max(1, comm.chunk_bytes // buffer.element_size()), comm.workspace, comm.stages)
