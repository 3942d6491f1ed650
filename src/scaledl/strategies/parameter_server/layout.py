"""Who serves and who trains: :class:`Layout` of a parameter-server job.

``servers = 0``: every rank trains and a server thread runs beside rank 0's worker (rank 0's
worker calls it in-process, the others over point-to-point).  ``servers = k > 0``: the last ``k``
ranks are dedicated servers, server ``j`` owning the ``j``-th contiguous shard of the flat
parameter vector; the other ranks are workers.  Without an initialized process group there is
one worker and an in-process server.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from scaledl.collectives.communicator import forget_communicator
from scaledl.strategies.parameter_server.protocol import ShardSpec
from scaledl.strategies.parameter_server.shard import shard_specs

__all__ = ["Layout", "plan_layout", "check_servers", "check_timeout"]


@dataclass
class Layout:
    """This rank's view of the roles (groups are filled in by :meth:`make_groups`)."""

    rank: int
    world_size: int
    servers: int
    shards: list[ShardSpec]
    ps_group: dist.ProcessGroup | None = None
    """Every rank: parameter-server traffic, apart from the collectives' tags."""
    worker_group: dist.ProcessGroup | None = None
    """The worker ranks (``None``: the default group, when every rank is a worker)."""

    @property
    def worker_ranks(self) -> list[int]:
        """Global ranks that train (the first ``world_size - servers``)."""
        return list(range(self.world_size - self.servers))

    @property
    def server_ranks(self) -> list[int]:
        """Global ranks that serve: the last ``servers`` ranks, or rank 0's thread."""
        if self.servers == 0:
            return [0]
        return list(range(self.world_size - self.servers, self.world_size))

    @property
    def is_worker(self) -> bool:
        """Whether this rank trains."""
        return self.rank < self.world_size - self.servers

    @property
    def hosts_shard(self) -> ShardSpec | None:
        """The shard this rank serves (rank 0 in thread mode, a dedicated server), or None."""
        if self.servers == 0:
            return self.shards[0] if self.rank == 0 else None
        if self.is_worker:
            return None
        return self.shards[self.rank - (self.world_size - self.servers)]

    @property
    def distributed(self) -> bool:
        """Whether there is more than one rank."""
        return self.world_size > 1

    def make_groups(self, timeout_s: float) -> None:
        """Create the groups; every rank must call it, in the same order as every other."""
        if not self.distributed:
            return
        timeout = timedelta(seconds=timeout_s)
        self.ps_group = dist.new_group(list(range(self.world_size)), timeout=timeout)
        if self.servers:
            self.worker_group = dist.new_group(self.worker_ranks, timeout=timeout)

    def destroy_groups(self) -> None:
        """Destroy the groups :meth:`make_groups` created (and any scaledl communicator cached for
        them); a rank outside the worker group only forgets its handle."""
        for group in (self.ps_group, self.worker_group):
            if group is None:
                continue
            forget_communicator(group)
            # torch types the non-member sentinel as an int, though new_group returns it as is
            if dist.is_initialized() and group != dist.GroupMember.NON_GROUP_MEMBER:  # type: ignore[comparison-overlap]
                dist.destroy_process_group(group)
        self.ps_group = self.worker_group = None


def check_servers(servers: int, world_size: int) -> int:
    """``servers`` if it leaves at least one worker among ``world_size`` ranks."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
        raise ValueError(f"servers {servers!r} must be an integer >= 0 (0: a server thread "
                         "beside rank 0)")
    if servers >= world_size:
        if world_size <= 1:
            raise ValueError(f"servers {servers} needs a spare rank but this job has "
                             f"{world_size} rank; use servers=0 (a server thread beside rank 0)")
        raise ValueError(f"servers {servers} leaves no worker among {world_size} ranks; use at "
                         f"most {world_size - 1} servers, or 0 for a server thread beside rank 0")
    return servers


def check_timeout(timeout_s: float) -> float:
    """``timeout_s`` if it is a positive number of seconds."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s {timeout_s} must be positive, e.g. 60")
    return float(timeout_s)


def plan_layout(servers: int, numel: int) -> Layout:
    """This rank's layout from the process group (one process when none is initialized)."""
    initialized = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if initialized else 0
    world_size = dist.get_world_size() if initialized else 1
    check_servers(servers, world_size)
    return Layout(rank, world_size, servers, shard_specs(numel, max(1, servers)))
