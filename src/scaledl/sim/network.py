"""The network model: link classes, hosts and racks from the topology axes, shared links.

A :class:`Network` gives every pair of ranks a link class from the outermost topology axis they
differ on (the axes are innermost first, as in :class:`scaledl.topology.Topology`):

- axis 0, the same host: ``intra`` (NVLink, PCIe, or loopback on the emulated cluster);
- axis 1, another host of the same rack: ``inter`` (the host's network interface);
- axis 2 and beyond, another rack: ``uplink`` (defaults to ``inter`` plus ``rack_latency``).

Each class has a latency ``alpha`` (seconds) and an inverse bandwidth ``beta`` (seconds per
byte).  Concurrent flows share links, counted per round of the schedules (the transfers of one
round are the ones in flight together):

- a rank's sends of one round over one class leave through one interface and share it;
- the ranks of a host that send off the host in the same round share its interface (as
  :func:`scaledl.collectives.replay.replay` models with ``node_of``);
- with ``oversubscription = k > 1`` the ranks of a rack that send off the rack in the same round
  share the rack's uplink, whose capacity is ``hosts per rack x uplink-class bandwidth / k``
  (the uplink class is ``inter`` unless an explicit ``uplink`` is given, so by default
  ``hosts per rack x NIC bandwidth / k``): a send off the rack is charged its bytes times
  ``max(host senders, rack senders x k / hosts per rack)`` at the uplink class's ``beta``.  A
  non-blocking fabric, ``k = 1``, never binds beyond the host interfaces.

Receives do not compete with sends (full-duplex links).  ``overhead`` is a per-round software
cost and ``gamma`` the reduction cost per byte, as in :class:`scaledl.collectives.cost.CostModel`.
Where bytes pass through the host CPU (TCP), a round is also CPU work: ``(sent + received) x
cpu_beta`` plus, for each byte sent off the host, ``cpu_beta_link`` times the flows of the host
leaving it in the same round, plus ``reduced x gamma``.  With ``cpu_contention`` ranks per core
the ranks' rounds of one index share the cores (processor sharing: equal works stretch by the
contention, a light round ends early and frees its share), and a round cannot end before its
work is done.  That is what bounds the emulated cluster at 10 Gbit/s.  A shaped interface
that idled (the emulated cluster's tbf links) passes ``burst_bytes`` at once: a collective's
first round off each host pays that many bytes less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from scaledl.collectives.cost import CostModel, LinkCost

__all__ = ["LinkClass", "Network", "INTRA", "INTER", "UPLINK", "CLASS_NAMES", "ranks_per_core"]

INTRA, INTER, UPLINK = 0, 1, 2
CLASS_NAMES = ("intra-host", "inter-host", "rack uplink")


@dataclass(frozen=True, init=False)
class LinkClass(LinkCost):
    """A named class of links: its latency ``alpha`` (s) and inverse bandwidth ``beta``
    (s/byte) are a :class:`~scaledl.collectives.cost.LinkCost`; the name labels reports."""

    name: str
    """What the class is (a preset's name, ``intra-host``, ...)."""

    def __init__(self, name: str, alpha: float, beta: float) -> None:
        object.__setattr__(self, "name", name)
        super().__init__(alpha, beta)

    def describe(self) -> str:
        """How error messages name this link."""
        return f"link {self.name!r}"

    @classmethod
    def from_bandwidth(cls, name: str, latency_s: float, gbytes_per_s: float) -> LinkClass:
        """A link of ``latency_s`` seconds and ``gbytes_per_s`` GB/s (10^9 bytes) one way."""
        if not math.isfinite(gbytes_per_s) or gbytes_per_s <= 0:
            raise ValueError(
                f"link {name!r} has bandwidth {gbytes_per_s} GB/s; give a bandwidth > 0"
            )
        return cls(name, latency_s, 1.0 / (gbytes_per_s * 1e9))


@dataclass(frozen=True)
class Network:
    """Link classes per topology level plus the software costs of the executor."""

    name: str
    intra: LinkClass
    inter: LinkClass
    uplink: LinkClass | None = None
    """Link between racks; None: ``inter`` with ``rack_latency`` added."""
    rack_latency: float = 1e-6
    """Extra latency of crossing racks (two more switch hops) when ``uplink`` is None."""
    oversubscription: float = 1.0
    """Hosts' bandwidth into a rack switch over its uplink bandwidth (1 = non-blocking)."""
    overhead: float = 0.0
    """Software cost per schedule round, seconds."""
    gamma: float = 0.0
    """Reduction cost, seconds per byte."""
    chunk_bytes: int = 1 << 20
    """Pipelining chunk of the executor: the reduction of one chunk is not hidden."""
    share_host_interface: bool = True
    """False: every rank has a network interface of its own (a uniform network)."""
    cpu_beta: float = 0.0
    """Host CPU seconds per byte a rank spends at each end of a transfer (TCP's copies and
    checksums; 0 for RDMA and NVLink): a round's sent plus received bytes cost this on the
    rank's CPU, with its reduction, and the round cannot end sooner."""
    tcp_inside: bool = True
    """Bytes between ranks of one host pass through sockets too (Gloo over loopback), so they
    cost ``cpu_beta``; False where they move over PCIe, NVLink or shared memory (NCCL on GPU
    hosts) and only bytes that leave the host are socket bytes."""
    cpu_beta_link: float = 0.0
    """Extra host CPU seconds per byte, at the sending end, of a transfer that crosses hosts,
    per flow of the host leaving it in the same round (a real network path: a veth, bridge and
    qdisc on the emulated cluster, run in the sender's context, against loopback inside a
    host)."""
    cpu_contention: float = 1.0
    """Ranks per CPU core when the ranks outnumber the cores (the emulated cluster: every host
    on one machine): the ranks' CPU work (transfers and reductions) of one round shares
    ``ranks / cpu_contention`` cores (equal works take this much longer)."""
    cores_per_rank: float = 0.0
    """CPU cores per rank where the job says how many it has (``--cores``); 0: not known.  With
    two or more, every rank's busy threads (its own and its communicator's) have a core each,
    and a stack whose per-call cost is the sharing of cores pays none
    (:meth:`~scaledl.sim.losses.Stack.call_seconds`)."""
    cpu_timeshare: tuple[tuple[float, float], ...] = ()
    """What time-sharing the cores adds to TCP's CPU cost per byte: ``(ranks per core,
    multiplier)`` points, sorted, piecewise linear between them, 1 at one rank per core and the
    last point's multiplier beyond it (:meth:`tcp_scale`); empty: nothing.  Waking a rank whose
    peer's bytes arrived, and streaming between two ranks that take turns on one core rather
    than run at once, cost CPU that a core per rank does not.  The cpu device's points are
    measured (``presets.CPU_TCP_TIMESHARE``)."""
    native_reduce_scatter_allreduce: bool = False
    """The backend's own reduce_scatter is a whole allreduce (Gloo); False: NCCL's own."""
    burst_bytes: float = 0.0
    """Bytes a shaped host interface passes at once after idling (a token bucket's depth:
    ``scaledl cluster``'s tbf links); a collective's first round off each host pays that many
    bytes less.  0 for real fabrics."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.oversubscription) or self.oversubscription < 1:
            raise ValueError(
                f"oversubscription {self.oversubscription} must be >= 1 (1 = non-blocking)"
            )
        for what, value in (("overhead", self.overhead), ("gamma", self.gamma),
                            ("rack latency", self.rack_latency), ("CPU cost", self.cpu_beta),
                            ("CPU cost per link byte", self.cpu_beta_link)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"network {what} {value} must be finite and >= 0")
        if not (math.isfinite(self.cpu_contention) and self.cpu_contention >= 1):
            raise ValueError(f"CPU contention {self.cpu_contention} must be >= 1")
        if not (math.isfinite(self.cores_per_rank) and self.cores_per_rank >= 0):
            raise ValueError(f"cores per rank {self.cores_per_rank} must be >= 0")
        if not (math.isfinite(self.burst_bytes) and self.burst_bytes >= 0):
            raise ValueError(f"burst {self.burst_bytes} bytes must be finite and >= 0")
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk_bytes {self.chunk_bytes} must be >= 1")
        _check_timeshare(self.cpu_timeshare)

    def tcp_scale(self) -> float:
        """The multiplier of ``cpu_beta`` and ``cpu_beta_link`` at ``cpu_contention`` ranks per
        core, from ``cpu_timeshare``."""
        if not self.cpu_timeshare or self.cpu_contention <= 1.0:
            return 1.0
        xs = [1.0] + [c for c, _ in self.cpu_timeshare]
        ys = [1.0] + [m for _, m in self.cpu_timeshare]
        return float(np.interp(self.cpu_contention, xs, ys))

    @property
    def classes(self) -> tuple[LinkClass, LinkClass, LinkClass]:
        """``(intra, inter, uplink)``, the uplink filled in from ``inter`` when not given."""
        uplink = self.uplink
        if uplink is None:
            uplink = LinkClass(self.inter.name, self.inter.alpha + self.rack_latency,
                               self.inter.beta)
        return (self.intra, self.inter, uplink)

    def link_of_axis(self, axis: int) -> LinkClass:
        """The class of a link whose outermost differing topology axis is ``axis``."""
        return self.classes[min(max(axis, 0), UPLINK)]

    def with_classes(self, alphas: tuple[float, ...], betas: tuple[float, ...]) -> Network:
        """The same network with new latencies and inverse bandwidths per class."""
        intra, inter, uplink = (
            replace(link, alpha=a, beta=b) for link, a, b in zip(self.classes, alphas, betas)
        )
        return replace(self, intra=intra, inter=inter, uplink=uplink)

    def to_cost_model(self) -> CostModel:
        """The same parameters in ``auto``'s calibration format (one link per axis)."""
        links = tuple(LinkCost(link.alpha, link.beta) for link in self.classes)
        return CostModel(links=links, overhead=self.overhead, gamma=self.gamma,
                         chunk_bytes=self.chunk_bytes,
                         native_reduce_scatter_allreduce=self.native_reduce_scatter_allreduce)

    @classmethod
    def from_cost_model(cls, model: CostModel, name: str = "calibrated") -> Network:
        """A network from a calibration file in ``auto``'s format (links innermost first)."""
        links = [model.link(axis) for axis in range(3)]
        intra, inter, uplink = (
            LinkClass(CLASS_NAMES[axis], link.alpha, link.beta) for axis, link in enumerate(links)
        )
        return cls(name, intra, inter, uplink, overhead=model.overhead, gamma=model.gamma,
                   chunk_bytes=model.chunk_bytes,
                   native_reduce_scatter_allreduce=model.native_reduce_scatter_allreduce)


def _check_timeshare(points: tuple[tuple[float, float], ...]) -> None:
    previous = 1.0
    for contention, multiplier in points:
        if not (math.isfinite(contention) and contention > previous):
            raise ValueError(f"CPU time-sharing point at {contention} ranks per core must be "
                             f"finite, above 1 and above the point before it")
        if not (math.isfinite(multiplier) and multiplier >= 1):
            raise ValueError(f"CPU time-sharing multiplier {multiplier} at {contention} ranks "
                             f"per core must be finite and >= 1 (sharing cores never makes "
                             f"TCP cheaper)")
        previous = contention


def ranks_per_core(world_size: int, cores: int) -> float:
    """``Network.cpu_contention`` of ``world_size`` ranks on ``cores`` cores: ranks per core
    where they outnumber the cores, else 1."""
    return max(1.0, world_size / cores)


def on_cores(network: Network, world_size: int, cores: int | None) -> Network:
    """``network`` for ``world_size`` ranks on ``cores`` CPU cores: its
    :attr:`~Network.cpu_contention` and :attr:`~Network.cores_per_rank` (without ``cores``, the
    defaults: no contention, cores not known), whatever an earlier call set."""
    if cores is None:
        return replace(network, cpu_contention=1.0, cores_per_rank=0.0)
    return replace(network, cpu_contention=ranks_per_core(world_size, cores),
                   cores_per_rank=cores / world_size)
