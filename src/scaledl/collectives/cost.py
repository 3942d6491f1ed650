"""The cost model: what a schedule's rounds and stages cost, from calibrated link classes.

A link class is a latency ``alpha`` (seconds) and an inverse bandwidth ``beta`` (seconds per
byte): one per topology axis (inside a host, between hosts, between racks ...), one for shared
memory among the ranks of a host, and the backend's own collectives priced on the same links with
their own overhead.  Each round of one rank's schedule costs

    overhead + max over its transfers (alpha[link] + bytes * beta[link])
             + reduction that the chunk pipeline cannot hide (gamma * one chunk)

where ``link`` is the outermost topology axis a transfer crosses (0 = inside a host), and a
stage costs what its path does (:func:`stage_time`).

Shared memory has regimes of its own, because its costs are a CPU's, not a wire's
(:func:`shm_terms`): a byte copied while every member's data fits the host's last-level cache
costs ``shm.beta``, beyond it main memory's ``shm_memory_beta``; a wait for a peer costs
``shm.alpha`` while the stage's ranks have a core each, and ``shm_timeshared_alpha`` (with all
the CPU work stretched by ranks per core) when they outnumber the host's cores, for then the
awaited peer must first be scheduled.  A whole-group ``shm`` call adds its fixed cost per call
(:func:`shm_call_time`): the direct call path's for a synchronous allreduce
(:mod:`scaledl.collectives.shm_direct`), the planned path's (validation, job, plan, stage
announcement) for the others.  :mod:`scaledl.collectives.auto` and
:mod:`scaledl.collectives.replay` use it to choose algorithms, ``scaledl.sim`` to predict whole
clusters.  Parameters come from ``scaledl bench collectives --calibrate`` (a JSON file at
``$SCALEDL_CALIBRATION`` or ``~/.cache/scaledl/calibration.json``) or from defaults measured on
the project's 2-core machine over loopback.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from scaledl.collectives.shm_ops import allreduce_pieces
from scaledl.collectives.schedule import Action, Collective, Path as StagePath, Schedule, Stage
from scaledl.topology import Topology, host_cores

__all__ = [
    "LinkCost", "CostModel", "stage_time", "shm_terms", "ShmTerms", "shm_call_time",
    "memory_factor",
    "schedule_time", "calibration_path", "CALIBRATION_ENV", "reduce_scatter_is_allreduce",
    "host_cores",
]

CALIBRATION_ENV = "SCALEDL_CALIBRATION"


@dataclass(frozen=True)
class LinkCost:
    """What a message costs on one class of links: ``alpha + bytes x beta`` seconds.

    The one (alpha, beta) pair of scaledl: the cost model's link classes (:class:`CostModel`),
    the replay's links (:mod:`scaledl.collectives.replay`) and the simulator's named link
    classes (``scaledl.sim.network.LinkClass``, a subclass) are all this.
    """

    alpha: float
    """Latency, seconds."""
    beta: float
    """Inverse bandwidth, seconds per byte (0: free)."""

    def __post_init__(self) -> None:
        for what, value in (("latency", self.alpha), ("seconds per byte", self.beta)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"{self.describe()} has {what} {value}; latencies and seconds per byte "
                    "must be finite and >= 0 (0: free)"
                )

    def describe(self) -> str:
        """How error messages name this link."""
        return "link"

    @property
    def gbytes_per_s(self) -> float:
        """Bandwidth in GB/s (10^9 bytes per second); infinite for ``beta == 0``."""
        return math.inf if self.beta == 0 else 1e-9 / self.beta

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over this link alone."""
        return self.alpha + nbytes * self.beta


@dataclass(frozen=True)
class CostModel:
    """Parameters of the schedule cost model."""

    links: tuple[LinkCost, ...] = (LinkCost(250e-6, 1 / 1.4e9), LinkCost(250e-6, 1 / 1.25e9))
    """One model per topology axis, innermost first; outer axes reuse the last entry.  Defaults:
    loopback TCP on the project's 2-core machine inside a host (``scaledl bench collectives
    --calibrate``, 2 ranks, OMP_NUM_THREADS=1: a round's software cost dominates the latency),
    the same cost per round over 10 Gbit/s Ethernet between hosts."""
    overhead: float = 40e-6
    """Software cost of one round of scaledl's executor, seconds."""
    gamma: float = 1 / 8e9
    """Reduction cost, seconds per byte."""
    chunk_bytes: int = 1 << 20
    """Pipelining chunk of the executor."""
    native_overhead: float = 10e-6
    """Per-round cost of the backend's own collectives, seconds."""
    native_beta_factor: float = 1.1
    """How much slower the backend's own collectives move bytes than scaledl's pipeline."""
    shm: LinkCost = LinkCost(8.7e-6, 1 / 5.3e9)
    """Shared memory among ranks of one host, each on a core of its own: ``alpha`` per wait for
    the peers (one piece has up to three), ``beta`` per byte copied while the stage's data fits
    :attr:`cache_bytes`; the adds cost ``gamma``.  Defaults of the shared-memory fields: fitted
    (``scaledl bench collectives --calibrate``'s fit) on the least loaded runs of the project's
    2-core machine, 2 and 4 ranks (benchmarks/auto/raw-2026-11-28/before-*.json)."""
    shm_memory_beta: float = 1 / 2.6e9
    """Seconds per byte copied through shared memory beyond the cache: the share of a stage's
    bytes that does not fit :attr:`cache_bytes` moves at main memory's speed."""
    cache_bytes: int = 32 << 20
    """The host's last-level cache, bytes: a shared-memory stage whose members' buffers
    together (``members x bytes``) fit in it copies at ``shm.beta``; of a larger one, the
    share ``cache_bytes / (members x bytes)`` does.  Calibration reads it from the machine."""
    shm_timeshared_alpha: float = 62.4e-6
    """Seconds per wait for a peer when the stage's ranks outnumber :attr:`host_cores`: the
    awaited rank must first get a core (its CPU work, copies, adds and call costs, also
    stretches by ranks per core).  Fitted on 4 ranks sharing 2 cores on a quiet machine after
    waits stopped spinning there (:attr:`~scaledl.transport.shm.ShmGroup.spins`; 1.2 ms while
    they spun; benchmarks/auto/raw-yield-2026-11-28, docs/benchmarks.md "auto's choices")."""
    timeshared_call_overhead: float = 272e-6
    """Seconds a planned whole-group shared-memory call adds when its ranks outnumber the
    host's cores (fitted with :attr:`shm_timeshared_alpha`; 3.2 ms while waits spun, which sent
    small reduce_scatter, allgather and broadcast calls to Gloo's rounds at 1.6-6.4x the
    shared-memory path's time)."""
    host_cores: int = 0
    """Cores the ranks of one host share; 0: unknown, never time-shared (the simulator, which
    models its hosts' cores itself).  :meth:`load` sets it from this machine."""
    call_overhead: float = 123e-6
    """Fixed seconds of one whole-group shared-memory call on the planned path: validation,
    the communicator's job, the plan, the stage's announcement (reduce_scatter, allgather,
    broadcast, reduce, and asynchronous calls)."""
    direct_call_overhead: float = 0.0
    """Fixed seconds of one synchronous allreduce on the shared-memory direct call path
    (:mod:`scaledl.collectives.shm_direct`: no job, no plan); the fit finds it below what
    its waits already cost."""
    shm_window: int = 4 << 20
    """Bytes of one shared-memory window: larger slices stream through it in pieces."""
    native_reduce_scatter_allreduce: bool = True
    """The backend runs reduce_scatter as an allreduce of the whole buffer and a copy (Gloo,
    the default); False where it has a reduce_scatter of its own (NCCL).  Prices the native
    collective and the ``native`` stages of hierarchical and torus."""

    def for_backend(self, backend: str) -> CostModel:
        """This model with the backend's own collectives priced as ``backend`` runs them
        (only Gloo runs reduce_scatter as a whole allreduce)."""
        return replace(self,
                       native_reduce_scatter_allreduce=reduce_scatter_is_allreduce(backend))

    def link(self, axis: int) -> LinkCost:
        """The model of a link that crosses ``axis``."""
        return self.links[min(max(axis, 0), len(self.links) - 1)]

    def to_vector(self) -> list[float]:
        """Every parameter as a float, the links first (counted), so that a model can travel
        in one tensor (a communicator's members agree on rank 0's); :meth:`from_vector` reads
        it back, ignoring anything after it."""
        values = [float(len(self.links))]
        for link in self.links:
            values += [link.alpha, link.beta]
        for item in fields(self)[1:]:
            value = getattr(self, item.name)
            values += [value.alpha, value.beta] if isinstance(value, LinkCost) else [float(value)]
        return values

    @classmethod
    def from_vector(cls, values: list[float]) -> CostModel:
        """The model :meth:`to_vector` wrote."""
        count = int(values[0])
        links = tuple(LinkCost(values[1 + 2 * i], values[2 + 2 * i]) for i in range(count))
        rest = iter(values[1 + 2 * count:])
        kwargs: dict[str, object] = {}
        for item in fields(cls)[1:]:
            kind = type(getattr(_DEFAULT, item.name))
            if kind is LinkCost:
                kwargs[item.name] = LinkCost(next(rest), next(rest))
            else:
                kwargs[item.name] = kind(next(rest))
        return cls(links, **kwargs)  # type: ignore[arg-type]

    def to_json(self) -> str:
        """Serialise (``from_json`` reads it back); without ``host_cores``, which belongs to the
        machine that loads the file (:meth:`load`), not to the one that wrote it."""
        data = asdict(self)
        del data["host_cores"]
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        """Parse a calibration file (one without the shared-memory class keeps its default)."""
        data = json.loads(text)
        data.pop("host_cores", None)  # the loading machine's (load), never a file's
        links = tuple(LinkCost(**link) for link in data.pop("links"))
        if "shm" in data:
            data["shm"] = LinkCost(**data["shm"])
        return cls(links=links, **data)

    @classmethod
    def load(cls, path: Path | None = None) -> CostModel:
        """The calibration at ``path`` (default location if None), or the defaults, with this
        machine's cores (:func:`host_cores`)."""
        target = path if path is not None else calibration_path()
        model = cls()
        if target.is_file():
            try:
                model = cls.from_json(target.read_text())
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(
                    f"calibration file {target} is unreadable ({error}); delete it or rerun "
                    "`scaledl bench collectives --calibrate`"
                ) from None
        return replace(model, host_cores=host_cores())

    def contention(self, ranks: int) -> float:
        """How much longer CPU work takes when ``ranks`` ranks of a host share its cores (1
        while each has a core, or the cores are unknown)."""
        if self.host_cores <= 0 or ranks <= self.host_cores:
            return 1.0
        return ranks / self.host_cores


_DEFAULT = CostModel()
"""The type of each field, for :meth:`CostModel.from_vector`."""


def reduce_scatter_is_allreduce(backend: str) -> bool:
    """True where the backend's own reduce_scatter is an allreduce of the whole buffer and a
    copy: Gloo (NCCL and MPI have their own)."""
    return backend == "gloo"


def calibration_path() -> Path:
    """Where calibration is read from and written to."""
    explicit = os.environ.get(CALIBRATION_ENV)
    if explicit:
        return Path(explicit)
    return Path.home() / ".cache" / "scaledl" / "calibration.json"


@dataclass(frozen=True)
class ShmTerms:
    """What a shared-memory stage pays, per parameter of the model (:func:`shm_terms`)."""

    waits: float
    """Waits for the peers."""
    cached_bytes: float
    """Bytes copied at the cache's speed (``shm.beta``)."""
    memory_bytes: float
    """Bytes copied at main memory's speed (``shm_memory_beta``)."""
    adds: float
    """Seconds of adds (``gamma`` per byte)."""
    timeshared: bool
    """The stage's ranks outnumber the host's cores: each wait costs
    ``shm_timeshared_alpha`` and all the CPU work stretches by ranks per core."""
    contention: float
    """Ranks per core when time-shared, else 1."""

    def seconds(self, model: CostModel) -> float:
        """The stage's time under ``model``."""
        alpha = model.shm_timeshared_alpha if self.timeshared else model.shm.alpha
        work = (self.cached_bytes * model.shm.beta + self.memory_bytes * model.shm_memory_beta
                + self.adds)
        return self.waits * alpha + work * self.contention


def shm_terms(stage: Stage, itemsize: int, model: CostModel) -> ShmTerms:
    """The waits, bytes copied (in and beyond the cache) and seconds of adds of a
    shared-memory stage on ``L`` members.

    Per piece of at most one window, reduce waits three times, copies the piece twice (in,
    out) and adds ``(L-1)/L`` of it; reduce_scatter waits once, copies its share in and adds
    it (a piece holds a window's worth of every member's part); allgather and broadcast wait
    once and copy once (in on one side, out on the others).  An allreduce runs the pieces of
    :func:`~scaledl.collectives.shm_ops.allreduce_pieces`: a split piece costs what reduce's
    does; what is summed whole (a small message, or a streamed one's small last piece) waits
    twice and every rank adds the whole of every peer's piece, and in 4- and 8-byte types
    (the NumPy path) it copies once, the sum reading the windows straight into the buffer.
    Of the bytes copied, the share ``cache_bytes / (L x bytes)`` (at most all) moves at the
    cache's speed, the rest at main memory's.
    """
    nbytes = stage.numel * itemsize
    members = len(stage.members)
    collective = stage.collective
    window = model.shm_window
    if collective is Collective.REDUCE_SCATTER:
        window = max(1, window // members) * members
    pieces = math.ceil(nbytes / window)
    adds = (members - 1) / members * nbytes * model.gamma
    if collective is Collective.ALLREDUCE:  # split pieces, then what is summed whole
        step, split_end = allreduce_pieces(stage.numel, itemsize, window)
        split_pieces = math.ceil(split_end / step)
        tail = (stage.numel - split_end) * itemsize
        waits = 3 * split_pieces + (2 if tail else 0)
        copied = 2 * (nbytes - tail) + (tail if itemsize >= 4 else 2 * tail)
        adds = ((members - 1) / members * (nbytes - tail) + (members - 1) * tail) * model.gamma
    elif collective is Collective.REDUCE:
        waits, copied = 3 * pieces, 2 * nbytes
    elif collective is Collective.REDUCE_SCATTER:
        waits, copied = pieces, nbytes
    else:
        waits, copied, adds = pieces, nbytes, 0.0
    footprint = members * nbytes
    cached = copied if footprint <= model.cache_bytes else copied * model.cache_bytes / footprint
    contention = model.contention(members)
    return ShmTerms(waits, cached, copied - cached, adds, contention > 1, contention)


def memory_factor(model: CostModel, footprint: float) -> float:
    """How much slower the bytes of a call move inside a host whose ranks hold ``footprint``
    bytes together than they would from the cache: 1 while it fits :attr:`CostModel.cache_bytes`;
    beyond it, the share that does not fit moves ``shm_memory_beta / shm.beta`` slower, over
    loopback sockets as through shared memory (both copy through the same memory).  1 where
    the host is unknown (``host_cores`` 0: the simulator's hosts)."""
    if model.host_cores <= 0 or footprint <= model.cache_bytes or model.shm.beta <= 0:
        return 1.0
    share = model.cache_bytes / footprint
    return share + (1 - share) * model.shm_memory_beta / model.shm.beta


def shm_call_time(collective: Collective, members: int, model: CostModel) -> float:
    """The fixed cost of one whole-group shared-memory call on ``members`` ranks: a
    synchronous allreduce takes the direct call path, everything else the planned path (an
    asynchronous allreduce too, which the model does not tell apart); stretched by ranks per
    core when they outnumber the host's cores, a planned call then also adding
    ``timeshared_call_overhead``."""
    contention = model.contention(members)
    if collective is Collective.ALLREDUCE:
        return model.direct_call_overhead * contention
    shared = model.timeshared_call_overhead if contention > 1 else 0.0
    return model.call_overhead * contention + shared


def stage_time(stage: Stage, itemsize: int, model: CostModel, sharers: int = 1) -> float:
    """Seconds a stage takes once every member has reached it.

    Shared memory: ``waits x alpha + (bytes copied x beta + adds) x ranks per core`` of the
    ``shm`` class, each in the regime the stage is in (:func:`shm_terms`).  The backend's own
    collective is priced as its ring (allreduce: the better of ring and halving-doubling;
    broadcast, reduce: a binomial tree) on the stage's link class with the backend's per-round
    overhead and bandwidth factor (a reduce_scatter as the whole buffer's allreduce where the
    backend runs it so: Gloo); ``sharers`` stages of one host that leave it at once share its
    interface, so their bytes move that much slower.
    """
    nbytes = stage.numel * itemsize
    members = len(stage.members)
    if nbytes == 0 or members < 2:
        return 0.0
    collective = stage.collective
    if stage.path is StagePath.SHM:
        return shm_terms(stage, itemsize, model).seconds(model)
    link = model.link(stage.level)
    beta = link.beta * model.native_beta_factor * (max(sharers, 1) if stage.level > 0 else 1)
    step = model.native_overhead + link.alpha
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        return math.ceil(math.log2(members)) * (step + nbytes * beta)
    ring = (members - 1) * (step + nbytes / members * beta)
    if collective is Collective.REDUCE_SCATTER and model.native_reduce_scatter_allreduce:
        collective = Collective.ALLREDUCE
    if collective is not Collective.ALLREDUCE:
        return ring
    rounds = 2 * math.ceil(math.log2(members))
    doubling = rounds * step + 2 * (members - 1) / members * nbytes * beta
    return min(2 * ring, doubling)


def schedule_time(
    schedule: Schedule, topology: Topology, itemsize: int, model: CostModel,
    overhead: float | None = None, beta_factor: float = 1.0,
) -> float:
    """Predicted seconds for one rank's schedule."""
    per_round = model.overhead if overhead is None else overhead
    total = 0.0
    for round_ in schedule.rounds:
        if round_.stage is not None:  # a host's ranks run their stages of a level at once
            sharers = topology.ranks_per_node if round_.stage.level > 0 else 1
            total += stage_time(round_.stage, itemsize, model, sharers)
            continue
        wire = 0.0
        reduced = 0
        sent: dict[int, int] = {}
        for t in round_.transfers:
            axis = topology.link_axis(schedule.rank, t.peer)
            link = model.link(axis)
            if t.is_send:
                sent[axis] = sent.get(axis, 0) + t.numel * itemsize
            else:
                wire = max(wire, link.alpha + t.numel * itemsize * link.beta * beta_factor)
            if t.action is Action.RECV_REDUCE:
                reduced += t.numel * itemsize
        for axis, nbytes in sent.items():
            link = model.link(axis)
            wire = max(wire, link.alpha + nbytes * link.beta * beta_factor)
        hidden = max(wire, reduced * model.gamma)
        total += per_round + hidden + min(reduced, model.chunk_bytes) * model.gamma
    return total
