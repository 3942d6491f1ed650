"""``scaledl bench collectives``: time every algorithm of every collective, nccl-tests style.

For each collective and message size the buffers are allocated once and reused by every
algorithm and peer library (``--peers``: :mod:`scaledl.bench.peers`).  Per contender:

1. verify: fill the buffers with rank-valued data (``(rank % 8) + 1 + index % 5``), run once and
   compare with the closed form; any rank's mismatch stops the benchmark on every rank;
2. warm up ``warmup`` iterations; the fastest sets how many back-to-back calls make one sample
   (enough for 2 ms: leaving the barrier before a sample skews the ranks by about 0.2 ms here,
   which would otherwise dominate small messages, as OSU's benchmarks also avoid), the typical
   one the number of samples (``target_seconds`` worth, 5..1000); every rank adopts the largest
   proposals (a native ``all_reduce`` MAX), so all ranks run the same counts;
3. time the samples *interleaved*: round after round, one sample of every contender (each after
   a barrier, the order rotating by one each round), as many rounds as the contender with the
   fewest proposed samples asked for, so a burst of load from elsewhere on the machine hits
   every contender alike and the ratios of medians hold even on a shared machine.  A sample's
   time per call is the slowest rank's.

The baseline ``torch`` is ``torch.distributed``'s own call, outside scaledl; ``native`` is the
same backend collective called through scaledl (on its channel).  The run also measures
ceilings: the rank 0 -> rank 1 point-to-point bandwidth of one large message (what the network
path can reach), one core's memory-copy bandwidth, and at every size of allreduce a copy of that
size on one core alone and on every rank at once (:func:`measure_copies`), the memory bound of
the shared-memory path.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scaledl.bench.peers import Peer, open_peers
from scaledl.bench.report import format_bytes
from scaledl.calibration.bench_file import CopyBound, Measurement, P2PResult
from scaledl.collectives.api import (
    allgather, allreduce, broadcast, reduce, reduce_scatter, resolve_algorithm,
)
from scaledl.collectives.auto import choose
from scaledl.collectives.communicator import communicator_for
from scaledl.collectives.registry import (
    ALGORITHMS, AUTO, available, parse_algorithm, parse_collective,
)
from scaledl.collectives.schedule import Collective
from scaledl.topology import Topology

__all__ = [
    "BenchConfig", "select_algorithms", "run_benchmark", "measure_p2p", "measure_memcpy",
    "measure_copies", "DTYPES", "DEFAULT_ALGORITHMS", "PEER_ALGORITHMS", "TORCH", "BenchRun",
]

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
}
TORCH = "torch"
"""The baseline: ``torch.distributed``'s own call on the group, outside scaledl altogether."""
DEFAULT_ALGORITHMS = ("ring", "multiring", "halving_doubling", "shm", "auto", "native", TORCH)
"""The default set, filtered per collective (``shm`` only on a group inside one host);
broadcast and reduce, which ring, multiring and halving-doubling do not implement, get ``tree``
and ``chain`` instead."""
PEER_ALGORITHMS = ("shm", "auto")
"""The default algorithms when peers are timed: the shared-memory path and ``auto``'s choice."""
_ROOTED_DEFAULT = ("tree", "chain", "shm", "auto", "native", TORCH)
MIN_ITERS, MAX_ITERS = 5, 1000
P2P_REPEATS = 5
COPY_SECONDS = 5e-4
"""Shortest timing of the memory copies: small ones repeat back to back until it lasts this."""


@dataclass(frozen=True)
class BenchConfig:
    """What to measure."""

    algorithms: dict[Collective, tuple[str, ...]]
    """Algorithms to run per collective, in order."""
    sizes: tuple[int, ...]
    """Message sizes in bytes (the whole buffer for reduce_scatter and allgather)."""
    dtype: str = "float32"
    """Element type, one of :data:`DTYPES`."""
    iters: int | None = None
    """Timed iterations; None = decided per size from the warm-up."""
    warmup: int = 5
    """Warm-up iterations per algorithm and size."""
    target_seconds: float = 0.5
    """Timed seconds aimed at per algorithm and size when ``iters`` is None."""
    topology: str | None = None
    """Topology spec such as ``2x2``; None = from the launcher (flat on one host)."""
    chunk_bytes: int | None = None
    """Executor pipelining chunk; None = the communicator's default."""
    p2p_bytes: int = 64 << 20
    """Message size of the point-to-point ceiling measurement."""
    explain: bool = False
    """Print ``auto``'s prediction table for every size."""
    peers: tuple[str, ...] = ()
    """Peer libraries timed beside scaledl (:data:`scaledl.bench.peers.PEERS`)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown --dtype {self.dtype!r}; use one of: {', '.join(DTYPES)}")
        if self.iters is not None and self.iters < 1:
            raise ValueError(f"--iters {self.iters} must be at least 1")
        if self.warmup < 0:
            raise ValueError(f"--warmup {self.warmup} must be >= 0")
        if self.chunk_bytes is not None and self.chunk_bytes < 1:
            raise ValueError(f"--chunk-bytes {self.chunk_bytes} must be at least 1")
        if not self.target_seconds > 0:
            raise ValueError(f"--target-seconds {self.target_seconds} must be positive")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The element type as a ``torch.dtype``."""
        return DTYPES[self.dtype]

    def needs_topology(self) -> list[str]:
        """Selected algorithms that need an explicit topology (hierarchical, torus)."""
        names = {name for names in self.algorithms.values() for name in names}
        return sorted(n for n in names if parse_algorithm(n)[0] in ALGORITHMS
                      and ALGORITHMS[parse_algorithm(n)[0]].needs_topology)


_NAMES = re.compile(r"[^,\[\]]+(?:\[[^\]]*\])?")
"""Comma-separated names, a bracket's commas kept: ``ring,torus[shm,ring]``."""


def select_algorithms(
    collectives: list[str], spec: str | None
) -> dict[Collective, tuple[str, ...]]:
    """Resolve ``--collectives`` and ``--algorithms`` (None = default, ``all``, or a list)."""
    chosen = [parse_collective(name.strip()) for name in collectives if name.strip()]
    if not chosen:
        raise ValueError("--collectives is empty; name at least one, e.g. allreduce")
    names = [n.strip() for n in _NAMES.findall(spec) if n.strip()] if spec else []
    everything = [n for n in ALGORITHMS if n != AUTO]
    for name in names:
        if parse_algorithm(name)[0] not in ALGORITHMS and name not in (AUTO, "all", TORCH):
            raise ValueError(f"unknown algorithm {name!r}; choose from: "
                             f"{', '.join(everything + [AUTO, TORCH, 'all'])}")
    result: dict[Collective, tuple[str, ...]] = {}
    for collective in dict.fromkeys(chosen):
        offered = available(collective)
        wanted: tuple[str, ...]
        if not names:
            wanted = DEFAULT_ALGORITHMS if collective in (Collective.ALLREDUCE,
                                                          Collective.REDUCE_SCATTER,
                                                          Collective.ALLGATHER) else _ROOTED_DEFAULT
        elif "all" in names:
            wanted = tuple(n for n in offered if n != AUTO) + (TORCH,)
        else:
            wanted = tuple(names)
        result[collective] = tuple(
            n for n in wanted if n == TORCH or parse_algorithm(n)[0] in offered
        )
    for name in names:
        if name != "all" and not any(name in algos for algos in result.values()):
            raise ValueError(f"algorithm {name!r} implements none of the collectives "
                             f"{', '.join(c.value for c in result)}")
    return result


class _Buffers:
    """The preallocated tensors of one collective and size, with fill and closed-form checks."""

    def __init__(self, collective: Collective, nbytes: int, dtype: torch.dtype, p: int) -> None:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        self.collective, self.p = collective, p
        self.shard = nbytes // itemsize // p
        if collective in (Collective.REDUCE_SCATTER, Collective.ALLGATHER):
            self.numel = self.shard * p
            self.full = torch.zeros(self.numel, dtype=dtype)
            self.part = torch.zeros(self.shard, dtype=dtype)
        else:
            self.numel = nbytes // itemsize
            self.full = torch.zeros(self.numel, dtype=dtype)
            self.part = self.full[:0]
        self.nbytes = self.numel * itemsize

    def call(self, algorithm: str, topology: Topology) -> Callable[[], object]:
        """The collective on these buffers with ``algorithm``, as a no-argument function."""
        c, full, part = self.collective, self.full, self.part
        if algorithm == TORCH:
            return _torch_call(c, full, part)
        if c is Collective.ALLREDUCE:
            return lambda: allreduce(full, algorithm=algorithm, topology=topology)
        if c is Collective.BROADCAST:
            return lambda: broadcast(full, 0, algorithm=algorithm, topology=topology)
        if c is Collective.REDUCE:
            return lambda: reduce(full, 0, algorithm=algorithm, topology=topology)
        if c is Collective.REDUCE_SCATTER:
            return lambda: reduce_scatter(part, full, algorithm=algorithm, topology=topology)
        return lambda: allgather(full, part, algorithm=algorithm, topology=topology)

    def fill(self, rank: int) -> None:
        """Rank-valued input: ``(rank % 8) + 1 + index % 5``."""
        source = self.part if self.collective is Collective.ALLGATHER else self.full
        _fill(source, rank % 8 + 1)

    def check(self, rank: int, keeps_others: bool = True) -> bool:
        """True when the result matches the closed form on this rank.  A reduce leaves the
        other ranks' buffers as they were when ``keeps_others`` (scaledl's promise); torch's
        own reduce and the peers' promise nothing there (Gloo leaves partial sums), so
        without it only the root's result is checked."""
        p, c, m = self.p, self.collective, self.shard
        total = sum(r % 8 + 1 for r in range(p))
        if c is Collective.ALLREDUCE or (c is Collective.REDUCE and rank == 0):
            return _holds(self.full, total, p)
        if c is Collective.REDUCE:
            return not keeps_others or _holds(self.full, rank % 8 + 1, 1)
        if c is Collective.BROADCAST:
            return _holds(self.full, 1, 1)
        if c is Collective.REDUCE_SCATTER:
            return _holds(self.part, total, p, rank * m)
        return all(_holds(self.full[r * m:(r + 1) * m], r % 8 + 1, 1) for r in range(p))


def _torch_call(c: Collective, full: torch.Tensor, part: torch.Tensor) -> Callable[[], object]:
    """``torch.distributed``'s own collective on the default group."""
    if c is Collective.ALLREDUCE:
        return lambda: dist.all_reduce(full)
    if c is Collective.BROADCAST:
        return lambda: dist.broadcast(full, 0)
    if c is Collective.REDUCE:
        return lambda: dist.reduce(full, 0)
    if c is Collective.REDUCE_SCATTER:
        return lambda: dist.reduce_scatter_tensor(part, full)
    return lambda: dist.all_gather_into_tensor(full, part)


def _fill(tensor: torch.Tensor, base: int) -> None:
    tensor.fill_(base)
    for k in range(1, 5):
        tensor[k::5] += k


def _holds(tensor: torch.Tensor, base: int, scale: int, offset: int = 0) -> bool:
    """``tensor[i] == base + scale * ((offset + i) % 5)`` (to 16-bit rounding where it applies)."""
    for k in range(min(5, tensor.numel())):
        want = base + scale * ((offset + k) % 5)
        view = tensor[k::5]
        if tensor.element_size() != 2:
            if bool((view != want).any()):
                return False
        elif (view.float() - want).abs().max().item() > 2.0 ** -7 * abs(want):
            return False
    return True


def _agree_max(values: list[float]) -> list[float]:
    """Element-wise maximum over all ranks (a native torch.distributed all_reduce)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


SAMPLE_SECONDS = 2e-3
"""Shortest sample: back-to-back calls until a sample lasts this long, so that the ranks'
skew in leaving the barrier before it (about 0.2 ms here) does not swamp small messages."""


def _timed(call: Callable[[], object], iterations: int, batch: int = 1) -> list[float]:
    """Per sample (after a barrier): the mean time of ``batch`` back-to-back calls."""
    times = []
    for _ in range(iterations):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(batch):
            call()
        times.append((time.perf_counter() - start) / batch)
    return times


@dataclass
class _Contender:
    """One algorithm or peer at one size, warmed up: its call and agreed sample counts."""

    name: str
    call: Callable[[], object]
    batch: int
    """Back-to-back calls per sample."""
    proposal: int
    """Samples it asks for (``target_seconds`` worth)."""
    resolved: str | None
    peer: bool = False
    times: list[float] = field(default_factory=list)


def _prepare(
    buffers: _Buffers, name: str, call: Callable[[], object], rank: int, config: BenchConfig,
    resolved: str | None, peer: bool = False,
) -> _Contender:
    """Verify ``call`` on ``buffers``, warm it up and agree on its batch and sample counts."""
    buffers.fill(rank)
    verify_time = _timed(call, 1)
    ours = not peer and name != TORCH
    failed = _agree_max([0.0 if buffers.check(rank, keeps_others=ours) else 1.0 + rank])[0]
    if failed:
        raise RuntimeError(
            f"{buffers.collective.value} with {name} on {format_bytes(buffers.nbytes)} "
            f"gave a wrong result on rank {int(failed) - 1} (the highest failing rank), so "
            "the bench stops: a wrong result is a defect, please report it with this line"
        )
    if buffers.collective in (Collective.ALLREDUCE, Collective.REDUCE):
        buffers.full.zero_()  # keep sums bounded while timing
    warm = _timed(call, config.warmup) or verify_time
    fastest = max(min(warm), 1e-7)
    batch = max(1, math.ceil(SAMPLE_SECONDS / fastest))
    proposal = math.ceil(config.target_seconds / (max(statistics.median(warm), 1e-7) * batch))
    agreed = _agree_max([float(batch), float(min(max(proposal, MIN_ITERS), MAX_ITERS))])
    return _Contender(name, call, int(agreed[0]), int(agreed[1]), resolved, peer)


def _sample_interleaved(contenders: list[_Contender], rounds: int) -> None:
    """``rounds`` rounds of one sample per contender, the order rotating each round; then each
    sample becomes the slowest rank's."""
    count = len(contenders)
    for round_index in range(rounds):
        for k in range(count):
            contender = contenders[(round_index + k) % count]
            contender.times.extend(_timed(contender.call, 1, contender.batch))
    flat = _agree_max([t for contender in contenders for t in contender.times])
    for index, contender in enumerate(contenders):
        contender.times = flat[index * rounds:(index + 1) * rounds]


def _resolved(buffers: _Buffers, algorithm: str, topology: Topology) -> str | None:
    """What ``algorithm`` ran as on these buffers (None for torch's own call)."""
    if algorithm == TORCH:
        return None
    blocks = buffers.collective in (Collective.REDUCE_SCATTER, Collective.ALLGATHER)
    return resolve_algorithm(buffers.collective.value, buffers.shard if blocks else buffers.numel,
                             buffers.full.dtype, algorithm, topology)


def measure_memcpy(nbytes: int) -> P2PResult:
    """One core copying ``nbytes`` from one buffer to another (median of a few): the ceiling of
    the shared-memory path, measured in the same run."""
    import numpy as np

    source = np.ones(max(1, nbytes // 4), dtype=np.float32)
    target = np.empty_like(source)
    np.copyto(target, source)  # touch every page first
    times = []
    for _ in range(P2P_REPEATS):
        start = time.perf_counter()
        np.copyto(target, source)
        times.append(time.perf_counter() - start)
    return P2PResult(source.nbytes, tuple(_agree_max(times)))


def measure_copies(buffers: _Buffers, rank: int) -> CopyBound:
    """A copy of the buffer's size on rank 0 alone (one core), then on every rank at once (each
    its own buffers; the slowest rank's time), medians of a few: the memory bound of a
    shared-memory collective of this size, measured beside it.  Small copies repeat back to
    back (as the collectives' samples do), so they run from the cache as a collective's would."""
    import numpy as np

    source = buffers.full.view(torch.uint8).numpy()
    target = np.empty_like(source)
    start = time.perf_counter()
    np.copyto(target, source)  # touch every page first
    repeat = int(_agree_max([float(max(1, math.ceil(COPY_SECONDS / max(
        time.perf_counter() - start, 1e-7))))])[0])

    def copies() -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            np.copyto(target, source)
        return (time.perf_counter() - start) / repeat

    alone, together = [], []
    for _ in range(P2P_REPEATS):
        dist.barrier()
        if rank == 0:
            alone.append(copies())
        dist.barrier()
        together.append(copies())
    one_core = _agree_max(alone if rank == 0 else [0.0] * P2P_REPEATS)
    return CopyBound(source.nbytes, buffers.p, statistics.median(one_core),
                     statistics.median(_agree_max(together)))


def usable(algorithm: str, topology: Topology) -> bool:
    """False for ``shm`` on a group that does not share one host's memory (it is skipped)."""
    base = parse_algorithm(algorithm)[0]
    if base not in ALGORITHMS or not ALGORITHMS[base].needs_shm:
        return True
    return communicator_for(None).fabric.one_host


def measure_p2p(nbytes: int, rank: int, world_size: int) -> P2PResult | None:
    """Rank 0 -> rank 1 send/recv bandwidth of one ``nbytes`` message (median of a few)."""
    if world_size < 2:
        return None
    buffer = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
    times = []
    for _ in range(P2P_REPEATS + 1):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(buffer, 1)
        elif rank == 1:
            dist.recv(buffer, 0)
        times.append(time.perf_counter() - start)
    return P2PResult(buffer.numel() * 4, tuple(_agree_max(times)[1:]))


def _explain(collective: Collective, buffers: _Buffers, topology: Topology) -> str:
    numel = buffers.shard if collective in (Collective.REDUCE_SCATTER,
                                            Collective.ALLGATHER) else buffers.numel
    itemsize = buffers.full.element_size()
    model = communicator_for(None).cost_model
    choice = choose(collective, topology, numel, itemsize, model)
    return f"{collective.value} {format_bytes(buffers.nbytes)}: {choice.explain()}"


@dataclass
class BenchRun:
    """What :func:`run_benchmark` measured; every rank holds the same."""

    measurements: list[Measurement]
    copies: list[CopyBound]
    """The memory bound at each size of allreduce (when peers are timed)."""
    peers: dict[str, str]
    """Each peer that ran: its name and the library it ran as."""
    skipped: list[str]
    """One line per peer that could not run, saying how to get it."""


def run_benchmark(
    config: BenchConfig, topology: Topology, echo: Callable[[str], None] | None = None
) -> BenchRun:
    """Measure every selected algorithm and peer at every size, interleaved per size; every rank
    returns the same results.

    ``echo`` (rank 0's console) receives the ``--explain`` tables and the skipped peers.
    """
    skipped = {n for names in config.algorithms.values() for n in names
               if not usable(n, topology)}
    if skipped:
        log.warning("skipping %s: the ranks do not share one host's memory", ", ".join(skipped))
    missing = [n for n in config.needs_topology() if not topology.explicit]
    if missing:
        raise ValueError(f"algorithm {missing[0]!r} needs the network layout: pass --topology "
                         f"RxH (R ranks per host, H hosts; product {topology.world_size})")
    comm = communicator_for(None)
    if config.chunk_bytes is not None:
        comm.chunk_bytes = config.chunk_bytes
    peers, missing_peers = open_peers(config.peers, comm.fabric.one_host)
    try:
        if peers:
            dist.barrier()  # every rank has opened every peer before any rank may close one
            for peer in peers:  # their files are mapped: a killed run then leaves none behind
                peer.close()
        for line in missing_peers:  # once: on rank 0's console, else in the log
            if echo is not None:
                echo(line)
            else:
                log.info("%s", line)
        run = BenchRun([], [], {peer.name: peer.label for peer in peers}, missing_peers)
        _measure(run, config, peers, topology, echo)
    finally:
        for peer in peers:
            peer.close()
    return run


def _measure(run: BenchRun, config: BenchConfig, peers: list[Peer], topology: Topology,
             echo: Callable[[str], None] | None) -> None:
    """Time every collective, size and contender of ``config`` into ``run``."""
    for collective, algorithms in config.algorithms.items():
        for nbytes in config.sizes:
            buffers = _Buffers(collective, nbytes, config.torch_dtype, topology.world_size)
            if buffers.numel == 0:
                log.warning("skipping %s at %s: fewer elements than ranks", collective.value,
                            format_bytes(nbytes))
                continue
            if buffers.nbytes != nbytes and topology.rank == 0:  # never swapped silently
                log.warning("%s of %d bytes is not a whole number of %s elements%s: timing %d "
                            "bytes", collective.value, nbytes, config.dtype,
                            "" if buffers.part.numel() == 0 else
                            f" for each of {topology.world_size} ranks", buffers.nbytes)
            if config.explain and echo is not None:
                echo(_explain(collective, buffers, topology))
            contenders = _contenders(buffers, algorithms, peers, topology, config)
            rounds = config.iters or min(c.proposal for c in contenders)
            _sample_interleaved(contenders, rounds)
            for c in contenders:
                measurement = Measurement(collective.value, c.name, buffers.nbytes,
                                          topology.world_size, tuple(c.times), c.resolved,
                                          peer=c.peer)
                log.info("%s %s %s: %.1f us median over %d samples", collective.value,
                         format_bytes(buffers.nbytes), c.name, measurement.median_us,
                         len(c.times))
                run.measurements.append(measurement)
            if peers and collective is Collective.ALLREDUCE:
                run.copies.append(measure_copies(buffers, topology.rank))
            del buffers, contenders


def _contenders(
    buffers: _Buffers, algorithms: tuple[str, ...], peers: list[Peer], topology: Topology,
    config: BenchConfig,
) -> list[_Contender]:
    """Every usable algorithm and every peer that offers this collective, verified and warm."""
    rank = topology.rank
    contenders = [
        _prepare(buffers, algorithm, buffers.call(algorithm, topology), rank, config,
                 _resolved(buffers, algorithm, topology))
        for algorithm in algorithms if usable(algorithm, topology)
    ]
    for peer in peers:
        call = peer.call(buffers.collective, buffers.full, buffers.part)
        if call is None:
            log.info("peer %s has no %s of %s; not timed", peer.name, buffers.collective.value,
                     buffers.full.dtype)
            continue
        contenders.append(_prepare(buffers, peer.name, call, rank, config, peer.label, True))
    return contenders
