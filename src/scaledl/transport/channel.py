"""Channels: the private connection scaledl opens for each process group it serves.

scaledl never sends on the user's process group.  The first scaledl call on a group opens a
*channel*: a second connection among the same ranks that only scaledl uses.  Two things follow.

- **Call order is scaledl's own business.**  An asynchronous scaledl collective runs later, on
  the communicator's thread; had it used the user's group, a ``torch.distributed`` call the user
  makes meanwhile on that group could be matched with it on one rank and not on another (Gloo
  and NCCL match collectives by call order, point-to-point messages by peer, tag and order), and
  the two tensors' values would be silently swapped.  On a channel of its own, scaledl's traffic
  can interleave with the user's in any order.
- **A thin data path.**  On Gloo the channel is a ``ProcessGroupGloo`` built directly from the
  job's rendezvous store and driven through its backend methods, without the bookkeeping of the
  ``torch.distributed`` functions.

Kinds of channel:

- Gloo: a private ``ProcessGroupGloo`` under the store prefix ``scaledl/<group name>/<n>``, where
  ``n`` counts the channels this process opened for that group (every member opens them in the
  same order, at its first scaledl call on the group).  Opening it connects the members to each
  other and involves nobody else.
- NCCL: a clone of the group made with ``torch.distributed.new_group(...,
  use_local_synchronization=True)`` (only members take part), used through the
  ``torch.distributed`` functions, whose ``batch_isend_irecv`` groups point-to-point operations
  as NCCL needs.
- MPI (and anything else): the user's group itself; MPI cannot create groups with local
  synchronisation, so on MPI an asynchronous scaledl call and a direct ``torch.distributed``
  call on the same group must not be in flight at once (docs/design.md).
"""

from __future__ import annotations

import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from scaledl.backend_errors import attempt, first_line  # first_line re-exported: its old home

__all__ = ["Channel", "open_channel", "group_timeout", "first_line"]

log = logging.getLogger(__name__)

_GENERATIONS: dict[str, itertools.count[int]] = {}
"""Channels opened per group name, so a reopened group gets fresh store keys."""


def group_timeout(group: dist.ProcessGroup) -> float:
    """Seconds the group's blocking calls may take (its backend's timeout, else 300 s)."""
    for device in (torch.device("cpu"), torch.device("cuda")):
        try:
            backend = group._get_backend(device)
            return float(backend.options._timeout.total_seconds())
        except (RuntimeError, AttributeError, ValueError):
            continue
    return 300.0


class Channel(ABC):
    """scaledl's private connection among the ranks of one process group."""

    rank: int
    """This process's rank in the group."""
    world_size: int
    """Ranks in the group."""
    backend: str
    """``gloo``, ``nccl`` or ``mpi``."""
    timeout: float
    """Seconds a blocking operation may take before the peer is reported."""
    global_ranks: tuple[int, ...]
    """Global rank of every group rank."""

    @property
    def device(self) -> torch.device:
        """Where small control tensors live: NCCL channels have no CPU side."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def ordered_by_peer(self) -> bool:
        """True when point-to-point messages are matched by posting order alone (NCCL)."""
        return self.backend == "nccl"

    @abstractmethod
    def post(self, ops: Sequence[tuple[bool, torch.Tensor, int, int]]) -> list[dist.Work]:
        """Post ``(is_send, tensor, peer, tag)`` operations together; one work per operation
        (or one for all, when the backend coalesces them)."""

    @abstractmethod
    def allreduce(self, tensor: torch.Tensor, op: dist.ReduceOp) -> None:
        """The backend's own allreduce, in place."""

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """The backend's own broadcast from group rank ``root``."""

    @abstractmethod
    def reduce(self, tensor: torch.Tensor, root: int, op: dist.ReduceOp) -> None:
        """The backend's own reduce to group rank ``root``."""

    @abstractmethod
    def allgather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        """The backend's own allgather of equal shards into ``output``."""

    @abstractmethod
    def reduce_scatter(self, output: torch.Tensor, source: torch.Tensor, op: dist.ReduceOp) -> None:
        """The backend's own reduce-scatter of ``source`` (``p`` blocks) into ``output``."""

    def exchange(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same count on every rank), by rank."""
        count = len(values)
        mine = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        everyone = torch.empty(count * self.world_size, dtype=torch.int64, device=self.device)
        self.allgather(everyone, mine)
        rows = everyone.cpu().view(self.world_size, count).tolist()
        return [[int(v) for v in row] for row in rows]

    @abstractmethod
    def subchannel(self, members: tuple[int, ...]) -> Channel:
        """A channel among ``members`` (ranks of this channel), opened on first use by every
        member (all of them must reach the call)."""

    def close(self) -> None:
        """Release the connection (default: nothing to do)."""

    def _wait(self, work: dist.Work, what: str) -> None:
        # judged outside any except block, so a Ctrl-C pending meanwhile is a bare interrupt
        error = attempt(lambda: work.wait(timedelta(seconds=self.timeout)))
        if isinstance(error, RuntimeError):
            from scaledl.transport.base import TransportError

            raise TransportError(
                f"{what} on scaledl's channel of {self.world_size} ranks failed: "
                f"{first_line(error)}; a peer may have died or fallen out of step (rerun with "
                "SCALEDL_DEBUG=1 to compare every rank's calls)"
            ) from error


class GlooChannel(Channel):
    """A private ``ProcessGroupGloo`` driven through its backend methods."""

    def __init__(
        self, prefix: str, rank: int, world_size: int, timeout: float,
        global_ranks: tuple[int, ...],
    ) -> None:
        self.prefix = prefix
        self.rank, self.world_size = rank, world_size
        self.backend = "gloo"
        self.timeout = timeout
        self.global_ranks = global_ranks
        store = dist.distributed_c10d.PrefixStore(
            prefix, dist.distributed_c10d._get_default_store()
        )
        try:
            # Any: torch's stubs omit the backend's methods (send, recv, _allgather_base, ...).
            self._pg: Any = dist.ProcessGroupGloo(
                store, rank, world_size, timedelta(seconds=timeout)
            )
        except RuntimeError as error:
            raise RuntimeError(
                f"rank {rank} could not connect scaledl's channel among {world_size} ranks "
                f"within {timeout:g} s: {first_line(error)}; every rank of the group must make "
                "the same scaledl calls"
            ) from error
        self._subchannels: dict[tuple[int, ...], Channel] = {}

    def close(self) -> None:
        """Drop the private process group (and the sub-channels') now, while the interpreter is
        whole: left to the interpreter's exit, its destruction can meet Gloo's threads half torn
        down and abort the process."""
        for channel in self._subchannels.values():
            channel.close()
        self._subchannels.clear()
        self._pg = None

    @classmethod
    def of_group(cls, group: dist.ProcessGroup, generation: int) -> GlooChannel:
        """The channel of ``group`` under the store prefix ``scaledl/<name>/<generation>``."""
        size = dist.get_world_size(group)
        return cls(
            f"scaledl/{group.group_name}/{generation}", dist.get_rank(group), size,
            group_timeout(group), tuple(dist.get_global_rank(group, r) for r in range(size)),
        )

    def subchannel(self, members: tuple[int, ...]) -> Channel:
        """A channel among ``members`` (ranks of this channel), opened by them on first use."""
        channel = self._subchannels.get(members)
        if channel is None:
            channel = GlooChannel(
                f"{self.prefix}/sub/{'-'.join(map(str, members))}", members.index(self.rank),
                len(members), self.timeout, tuple(self.global_ranks[m] for m in members),
            )
            self._subchannels[members] = channel
        return channel

    def post(self, ops: Sequence[tuple[bool, torch.Tensor, int, int]]) -> list[dist.Work]:
        return [
            self._pg.send([tensor], peer, tag) if is_send else self._pg.recv([tensor], peer, tag)
            for is_send, tensor, peer, tag in ops
        ]

    def allreduce(self, tensor: torch.Tensor, op: dist.ReduceOp) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = op
        self._wait(self._pg.allreduce([tensor], options), "allreduce")

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = root, 0
        self._wait(self._pg.broadcast([tensor], options), "broadcast")

    def reduce(self, tensor: torch.Tensor, root: int, op: dist.ReduceOp) -> None:
        options = dist.ReduceOptions()
        options.reduceOp, options.rootRank, options.rootTensor = op, root, 0
        self._wait(self._pg.reduce([tensor], options), "reduce")

    def allgather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        self._wait(self._pg._allgather_base(output, shard), "allgather")

    def reduce_scatter(self, output: torch.Tensor, source: torch.Tensor, op: dist.ReduceOp) -> None:
        options = dist.ReduceScatterOptions()
        options.reduceOp = op
        self._wait(self._pg._reduce_scatter_base(output, source, options), "reduce_scatter")


class GroupChannel(Channel):
    """A registered process group used through the ``torch.distributed`` functions."""

    def __init__(self, group: dist.ProcessGroup, owned: bool) -> None:
        self.group = group
        self.owned = owned
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self.timeout = group_timeout(group)
        self.global_ranks = tuple(dist.get_global_rank(group, r) for r in range(self.world_size))
        self._subchannels: dict[tuple[int, ...], Channel] = {}

    def post(self, ops: Sequence[tuple[bool, torch.Tensor, int, int]]) -> list[dist.Work]:
        if self.backend == "nccl":
            batch = [
                dist.P2POp(dist.isend if is_send else dist.irecv, tensor,
                           self.global_ranks[peer], self.group, tag)
                for is_send, tensor, peer, tag in ops
            ]
            return list(dist.batch_isend_irecv(batch))
        works: list[dist.Work] = []
        for is_send, tensor, peer, tag in ops:
            post = dist.isend if is_send else dist.irecv
            work = post(tensor, self.global_ranks[peer], group=self.group, tag=tag)
            assert work is not None
            works.append(work)
        return works

    def allreduce(self, tensor: torch.Tensor, op: dist.ReduceOp) -> None:
        dist.all_reduce(tensor, op=op, group=self.group)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        dist.broadcast(tensor, src=self.global_ranks[root], group=self.group)

    def reduce(self, tensor: torch.Tensor, root: int, op: dist.ReduceOp) -> None:
        dist.reduce(tensor, dst=self.global_ranks[root], op=op, group=self.group)

    def allgather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        dist.all_gather_into_tensor(output, shard, group=self.group)

    def reduce_scatter(self, output: torch.Tensor, source: torch.Tensor, op: dist.ReduceOp) -> None:
        dist.reduce_scatter_tensor(output, source, op=op, group=self.group)

    def subchannel(self, members: tuple[int, ...]) -> Channel:
        channel = self._subchannels.get(members)
        if channel is None:
            if self.backend != "nccl":
                raise ValueError(f"a native stage needs a gloo or nccl group, not {self.backend}")
            ranks = [self.global_ranks[m] for m in members]
            clone = dist.new_group(ranks, timeout=timedelta(seconds=self.timeout),
                                   use_local_synchronization=True)
            assert isinstance(clone, dist.ProcessGroup)
            channel = GroupChannel(clone, owned=True)
            self._subchannels[members] = channel
        return channel

    def close(self) -> None:
        for channel in self._subchannels.values():
            channel.close()
        if self.owned and dist.is_initialized():
            try:
                dist.destroy_process_group(self.group)
            except (RuntimeError, ValueError) as error:  # already gone with the default group
                log.debug("could not destroy scaledl's channel group: %s", first_line(error))


def _clone(group: dist.ProcessGroup) -> dist.ProcessGroup | None:
    ranks = list(dist.get_process_group_ranks(group))
    try:
        clone = dist.new_group(ranks, timeout=timedelta(seconds=group_timeout(group)),
                               use_local_synchronization=True)
    except ValueError as error:  # a group of these ranks with local synchronisation exists
        log.warning("scaledl shares the user's process group (%s); do not mix asynchronous "
                    "scaledl calls with direct torch.distributed calls on it", first_line(error))
        return None
    return clone if isinstance(clone, dist.ProcessGroup) else None


def open_channel(group: dist.ProcessGroup) -> Channel:
    """Open scaledl's private channel for ``group`` (every member must call this, in the same
    order relative to its other scaledl calls on the group)."""
    backend = str(dist.get_backend(group))
    generation = next(_GENERATIONS.setdefault(group.group_name, itertools.count()))
    if backend == "gloo":
        return GlooChannel.of_group(group, generation)
    if backend == "nccl":
        clone = _clone(group)
        if clone is not None:
            return GroupChannel(clone, owned=True)
    return GroupChannel(group, owned=False)
