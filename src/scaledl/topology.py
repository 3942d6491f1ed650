"""Topology: who is where in a job.

A :class:`Topology` describes the ranks of one process group as a grid whose axes follow the
network hierarchy, innermost first, as PowerAI DDL describes its learners: ``4x8x2`` means 4 ranks
per host, 8 hosts per rack, 2 racks.  Ranks sharing every coordinate but the first live on one
host (a *node*); the first coordinate is the *local rank*.

By default rank ``r`` sits at grid position ``r`` (coordinates are ``r`` written in the mixed radix
of the axes, innermost digit first), which is how torchrun, ``mpirun --map-by core`` and SLURM's
block distribution number ranks.  When a launcher numbers ranks differently, ``order`` gives the
rank at each grid position.

A topology is a value: collectives take it as an argument.  The one record kept per process is
the :class:`JobLayout` that ``scaledl.init()`` agreed with every rank (the world's topology and
the host of every rank), so that defaults never depend on one rank's environment.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Topology", "parse_axes", "TOPOLOGY_ENV", "JobLayout", "record_job", "current_job",
    "forget_job", "host_cores",
]

TOPOLOGY_ENV = "SCALEDL_TOPOLOGY"
"""Environment variable holding an explicit topology spec such as ``2x2`` or ``4x8x2``."""


def parse_axes(spec: str) -> tuple[int, ...]:
    """Parse ``"4x8x2"`` into ``(4, 8, 2)``; raise ``ValueError`` naming the spec when malformed."""
    if not isinstance(spec, str):
        raise TypeError(f"a topology is a spec such as '4x2' (ranks per host x hosts), got "
                        f"{type(spec).__name__} {spec!r}")
    parts = spec.strip().lower().replace("*", "x").split("x")
    try:
        axes = tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError(
            f"topology {spec!r} is not a list of positive integers joined by 'x'; "
            "write it innermost axis first, e.g. '4x8x2' for 4 ranks per host, 8 hosts, 2 racks"
        ) from None
    if not axes or any(size < 1 for size in axes):
        raise ValueError(f"topology {spec!r} has an axis smaller than 1; every axis must be >= 1")
    return axes


@dataclass(frozen=True)
class Topology:
    """The ranks of a process group laid out on a grid of network axes (innermost first)."""

    axes: tuple[int, ...]
    """Size of each axis, innermost first: ``(ranks per host, hosts per rack, racks, ...)``."""
    rank: int = 0
    """This process's rank in the group the topology describes."""
    order: tuple[int, ...] | None = None
    """Rank at each grid position; ``None`` means rank ``r`` sits at position ``r``."""
    explicit: bool = False
    """True when the layout was given by the user or found from hosts, not assumed flat."""
    _position: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.axes or any(int(size) < 1 for size in self.axes):
            raise ValueError(f"topology axes {self.axes} must be a non-empty list of sizes >= 1")
        object.__setattr__(self, "axes", tuple(int(size) for size in self.axes))
        world_size = self.world_size
        if not 0 <= self.rank < world_size:
            raise ValueError(
                f"rank {self.rank} is outside topology {self.spec} of {world_size} ranks; "
                f"ranks must be in 0..{world_size - 1}"
            )
        if self.order is None:
            position = tuple(range(world_size))
        else:
            if sorted(self.order) != list(range(world_size)):
                raise ValueError(
                    f"topology order {self.order} must list every rank 0..{world_size - 1} once"
                )
            inverse = [0] * world_size
            for grid_position, rank in enumerate(self.order):
                inverse[rank] = grid_position
            position = tuple(inverse)
        object.__setattr__(self, "_position", position)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def flat(cls, world_size: int, rank: int = 0) -> Topology:
        """All ranks on one axis: no hierarchy known."""
        if world_size < 1:
            raise ValueError(f"world size {world_size} must be >= 1")
        return cls(axes=(world_size,), rank=rank)

    @classmethod
    def parse(cls, spec: str, world_size: int | None = None, rank: int = 0) -> Topology:
        """Build a topology from ``"4x8x2"``; check that it multiplies to ``world_size``."""
        axes = parse_axes(spec)
        product = math.prod(axes)
        if world_size is not None and product != world_size:
            raise ValueError(
                f"topology {spec!r} describes {product} ranks but the world size is {world_size}; "
                f"give axes whose product is {world_size} (e.g. '{world_size}' for a flat layout)"
            )
        return cls(axes=axes, rank=rank, explicit=True)

    @classmethod
    def from_hosts(cls, hostnames: list[str], rank: int = 0) -> Topology:
        """Group ranks by host name (one entry per rank); every host must hold as many ranks."""
        hosts: dict[str, list[int]] = {}
        for member, host in enumerate(hostnames):
            hosts.setdefault(host, []).append(member)
        sizes = {len(members) for members in hosts.values()}
        if len(sizes) != 1:
            counts = {host: len(members) for host, members in hosts.items()}
            raise ValueError(
                f"hosts hold different numbers of ranks {counts}; scaledl needs the same number "
                f"per host, or set {TOPOLOGY_ENV} to describe the layout yourself"
            )
        per_host = sizes.pop()
        order = tuple(member for members in hosts.values() for member in members)
        axes = (per_host, len(hosts)) if len(hosts) > 1 else (per_host,)
        identity = order == tuple(range(len(hostnames)))
        return cls(axes=axes, rank=rank, order=None if identity else order, explicit=len(hosts) > 1)

    def with_rank(self, rank: int) -> Topology:
        """The same layout seen from another rank."""
        return Topology(axes=self.axes, rank=rank, order=self.order, explicit=self.explicit)

    # -- queries --------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of ranks: the product of the axes."""
        return math.prod(self.axes)

    @property
    def spec(self) -> str:
        """The axes written as ``"4x8x2"``."""
        return "x".join(str(size) for size in self.axes)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on one host: the innermost axis."""
        return self.axes[0]

    @property
    def num_nodes(self) -> int:
        """Number of hosts."""
        return self.world_size // self.axes[0]

    def coords(self, rank: int) -> tuple[int, ...]:
        """Grid coordinates of ``rank``, innermost first."""
        self._check_rank(rank)
        position = self._position[rank]
        coords = []
        for size in self.axes:
            position, digit = divmod(position, size)
            coords.append(digit)
        return tuple(coords)

    def rank_at(self, coords: tuple[int, ...]) -> int:
        """The rank at grid coordinates ``coords`` (innermost first)."""
        if len(coords) != len(self.axes) or any(
            not 0 <= c < size for c, size in zip(coords, self.axes)
        ):
            raise ValueError(f"coordinates {coords} do not fit topology {self.spec}")
        position = 0
        for c, size in zip(reversed(coords), reversed(self.axes)):
            position = position * size + c
        return position if self.order is None else self.order[position]

    def node(self, rank: int) -> int:
        """Index of the host holding ``rank``."""
        return self._position[self._check_rank(rank)] // self.axes[0]

    def local_rank(self, rank: int) -> int:
        """Position of ``rank`` on its host."""
        return self._position[self._check_rank(rank)] % self.axes[0]

    def axis_group(self, rank: int, axis: int) -> tuple[int, ...]:
        """Ranks that differ from ``rank`` only along ``axis``, ordered by that coordinate."""
        if not 0 <= axis < len(self.axes):
            raise ValueError(f"axis {axis} does not exist in topology {self.spec}")
        coords = list(self.coords(rank))
        members = []
        for c in range(self.axes[axis]):
            coords[axis] = c
            members.append(self.rank_at(tuple(coords)))
        return tuple(members)

    def axis_groups(self, axis: int) -> list[tuple[int, ...]]:
        """Every group along ``axis``; together they partition the ranks."""
        seen: set[int] = set()
        groups = []
        for rank in range(self.world_size):
            if rank not in seen:
                group = self.axis_group(rank, axis)
                seen.update(group)
                groups.append(group)
        return groups

    def node_ranks(self, node: int) -> tuple[int, ...]:
        """Ranks on host ``node``, by local rank."""
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node {node} does not exist in topology {self.spec}")
        start = node * self.axes[0]
        positions = range(start, start + self.axes[0])
        return tuple(p if self.order is None else self.order[p] for p in positions)

    def link_axis(self, a: int, b: int) -> int:
        """The outermost axis along which ``a`` and ``b`` differ (0 = same host); -1 if a == b."""
        ca, cb = self.coords(a), self.coords(b)
        differing = [axis for axis in range(len(self.axes)) if ca[axis] != cb[axis]]
        return differing[-1] if differing else -1

    def _check_rank(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside topology {self.spec}")
        return rank

    @property
    def layout(self) -> str:
        """The layout in words, the same on every rank (what ranks compare before agreeing on
        it): the axes, the rank order when it is not the identity, and whether it was assumed."""
        text = self.spec
        if self.order is not None:
            text += f" in rank order {list(self.order)}"
        return text if self.explicit else text + " (assumed flat)"

    def __str__(self) -> str:
        return f"Topology({self.spec}, rank={self.rank})"


def host_digest(host: str) -> int:
    """A 63-bit digest of a host name, for exchanging hosts as integers."""
    return int.from_bytes(hashlib.sha1(host.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class JobLayout:
    """What every rank of the job agreed on at ``scaledl.init()``."""

    topology: Topology
    """The world's layout, seen from this process's rank."""
    hosts: tuple[str, ...]
    """Host name of every global rank (``SCALEDL_HOSTNAME`` or the machine's)."""

    def topology_for(self, global_ranks: Sequence[int], rank: int) -> Topology:
        """The default layout of a group made of ``global_ranks`` (``rank``: ours in it).

        The world gets the agreed topology; a subgroup is laid out by the hosts of its members,
        or flat when its hosts hold different numbers of them.
        """
        if list(global_ranks) == list(range(self.topology.world_size)):
            return self.topology.with_rank(rank)
        return topology_of_hosts([self.hosts[g] for g in global_ranks], rank)


def topology_of_hosts(hosts: Sequence[str | int], rank: int) -> Topology:
    """Ranks grouped by host; flat (not explicit) when hosts hold different numbers of ranks."""
    try:
        return Topology.from_hosts([str(host) for host in hosts], rank)
    except ValueError:
        return Topology.flat(len(hosts), rank)


_JOB: list[JobLayout] = []


def record_job(layout: JobLayout) -> None:
    """Remember the layout ``scaledl.init()`` agreed on (replacing an earlier one)."""
    _JOB[:] = [layout]


def current_job() -> JobLayout | None:
    """The layout agreed at ``scaledl.init()``, or None before it (or after shutdown)."""
    return _JOB[0] if _JOB else None


def forget_job() -> None:
    """Drop the recorded layout (``scaledl.shutdown()``)."""
    _JOB.clear()


def host_cores(pids: Iterable[int] = (0,)) -> int:
    """Cores the processes ``pids`` (0: this one) may run on together: the union of their CPU
    affinities (ranks bound to a core each by ``mpirun`` or ``srun`` still count a core each),
    at most the CPU quota of this process's cgroup (``docker --cpus``, which no affinity
    shows).  A process that is gone, or a platform without affinities, counts as every core."""
    cores: set[int] = set()
    try:
        for pid in pids:
            cores |= os.sched_getaffinity(pid)
    except (AttributeError, OSError):  # no affinity call here, or the process is gone
        cores = set()
    count = len(cores) or os.cpu_count() or 1
    quota = _cgroup_cpus()
    return max(1, min(count, quota)) if quota is not None else count


def _cgroup_cpus() -> int | None:
    """Whole cores the cgroup's CPU quota allows (rounded up), or None without a quota."""
    for path, parse in ((Path("/sys/fs/cgroup/cpu.max"), _cpu_max),
                        (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), _cfs_quota)):
        try:
            text = path.read_text()
        except OSError:
            continue
        return parse(text, path)
    return None


def _cpu_max(text: str, path: Path) -> int | None:
    """cgroup v2's ``cpu.max``: ``"max 100000"`` or ``"<quota> <period>"``."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return -(-int(fields[0]) // int(fields[1]))


def _cfs_quota(text: str, path: Path) -> int | None:
    """cgroup v1's ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    quota = int(text.strip())
    if quota <= 0:
        return None
    period = int((path.parent / "cpu.cfs_period_us").read_text().strip())
    return -(-quota // period)
