"""The benchmark file: what ``scaledl bench collectives --json`` writes and what calibration reads.

One schema (``scaledl.bench.collectives/1``), written and read here only.  The writer's side is
the run's values (:class:`Measurement`, :class:`P2PResult`, :class:`CopyBound`,
:class:`BenchReport`) and their JSON form (:meth:`BenchReport.to_dict`, :func:`write_json`,
:func:`report_from_dict`); bandwidths follow nccl-tests (``doc/PERFORMANCE.md``):
``algbw = S / t`` with ``S`` the bytes of the whole buffer (for reduce_scatter and allgather the
full ``p x shard`` buffer), and ``busbw = algbw x factor`` with factor ``2(p-1)/p`` for
allreduce, ``(p-1)/p`` for reduce_scatter and allgather, and ``1`` for broadcast and reduce, so
busbw is comparable to the speed of one link whatever ``p``.  Latencies are OSU-style
microseconds per iteration; each iteration's time is the slowest rank's.  GB/s means 10^9 bytes
per second.

The reader's side, :func:`read_rows`, reads every result row of a user's files and checks each
field, so that a broken file is one error naming the file, the row and the value, before any fit
or replay; :func:`row_topologies` gives the layout a row's plans were made for and where its
ranks sat.  The presentation of a run (header lines, the plot) is :mod:`scaledl.bench.report`'s.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaledl.collectives.schedule import Collective
from scaledl.json_fields import is_duration, is_object, is_whole, shown
from scaledl.topology import Topology

__all__ = [
    "busbw_factor", "Measurement", "P2PResult", "CopyBound", "BenchReport", "native_ratios",
    "peer_rows", "write_json", "report_from_dict",
    "BenchRow", "read_rows", "row_topologies", "ITEMSIZES", "RERUN",
]


def busbw_factor(collective: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor for ``collective`` on ``world_size`` ranks."""
    p = world_size
    if collective == "allreduce":
        return 2 * (p - 1) / p
    if collective in ("reduce_scatter", "allgather"):
        return (p - 1) / p
    if collective in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"no bus bandwidth factor for collective {collective!r}")


@dataclass(frozen=True)
class Measurement:
    """Timed iterations of one algorithm on one collective and message size."""

    collective: str
    algorithm: str
    nbytes: int
    """Bytes of the whole buffer (``p x shard`` for reduce_scatter and allgather)."""
    world_size: int
    times_s: tuple[float, ...]
    """Per-iteration seconds, each the maximum over ranks."""
    resolved: str | None = None
    """The algorithm that ran, with the paths per level it was given or chosen (for example
    ``hierarchical[shm,ring]`` for ``hierarchical``, or ``auto``'s choice); None: not known
    (``torch``, or a file written before this was recorded); for a peer, the library that ran."""
    peer: bool = False
    """A peer library (``--peers``), not one of scaledl's algorithms."""

    @property
    def avg_us(self) -> float:
        """Mean latency, microseconds."""
        return statistics.fmean(self.times_s) * 1e6

    @property
    def min_us(self) -> float:
        """Fastest iteration, microseconds."""
        return min(self.times_s) * 1e6

    @property
    def max_us(self) -> float:
        """Slowest iteration, microseconds."""
        return max(self.times_s) * 1e6

    @property
    def median_us(self) -> float:
        """Median latency, microseconds."""
        return statistics.median(self.times_s) * 1e6

    @property
    def algbw_gbps(self) -> float:
        """Algorithm bandwidth at the mean latency, GB/s."""
        return self.nbytes / (self.avg_us * 1e-6) / 1e9

    @property
    def busbw_gbps(self) -> float:
        """Bus bandwidth (nccl-tests), GB/s."""
        return self.algbw_gbps * busbw_factor(self.collective, self.world_size)

    def to_dict(self, p2p_gbps: float | None = None) -> dict[str, Any]:
        """JSON-ready summary with the raw per-iteration times."""
        fraction = self.busbw_gbps / p2p_gbps if p2p_gbps else None
        return {
            "collective": self.collective, "algorithm": self.algorithm,
            "resolved": self.resolved, "peer": self.peer, "nbytes": self.nbytes,
            "world_size": self.world_size,
            "iterations": len(self.times_s),
            "avg_us": self.avg_us, "min_us": self.min_us, "max_us": self.max_us,
            "median_us": self.median_us, "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps, "busbw_over_p2p": fraction,
            "times_us": [t * 1e6 for t in self.times_s],
        }


@dataclass(frozen=True)
class P2PResult:
    """Point-to-point loopback bandwidth, rank 0 -> rank 1: the ceiling busbw is compared to."""

    nbytes: int
    times_s: tuple[float, ...]

    @property
    def gbps(self) -> float:
        """Bandwidth at the median time, GB/s."""
        return self.nbytes / statistics.median(self.times_s) / 1e9


@dataclass(frozen=True)
class CopyBound:
    """Memory copies of one message size, measured beside the collectives: the memory bound.

    An allreduce of private buffers through shared memory needs at least two copies' worth of
    traffic on every rank (its input into shared memory, its result out), all ranks at once, so
    its time is at least twice that of every rank copying ``nbytes`` at once; reading the peers'
    data to reduce it comes on top, so the bound is generous to the collective."""

    nbytes: int
    world_size: int
    one_core_s: float
    """Median seconds of one copy of ``nbytes`` by rank 0 while the others wait."""
    all_ranks_s: float
    """Median seconds of every rank copying ``nbytes`` at once (the slowest rank's)."""

    @property
    def one_core_gbps(self) -> float:
        """Bytes copied per second by one core alone, GB/s."""
        return self.nbytes / self.one_core_s / 1e9

    @property
    def all_ranks_gbps(self) -> float:
        """Bytes copied per second by all ranks together, GB/s."""
        return self.world_size * self.nbytes / self.all_ranks_s / 1e9

    @property
    def allreduce_busbw_gbps(self) -> float:
        """The highest allreduce busbw the memory allows: busbw at twice the all-ranks copy."""
        return self.nbytes / (2 * self.all_ranks_s) / 1e9 * busbw_factor("allreduce",
                                                                         self.world_size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"nbytes": self.nbytes, "world_size": self.world_size,
                "one_core_us": self.one_core_s * 1e6, "all_ranks_us": self.all_ranks_s * 1e6,
                "one_core_gbps": self.one_core_gbps, "all_ranks_gbps": self.all_ranks_gbps,
                "allreduce_busbw_bound_gbps": self.allreduce_busbw_gbps}


@dataclass
class BenchReport:
    """Everything one run measured, with the environment and configuration that produced it."""

    environment: dict[str, Any]
    config: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)
    p2p: P2PResult | None = None
    calibration: dict[str, Any] | None = None
    memcpy: P2PResult | None = None
    """One core's memory-copy bandwidth: the shared-memory path's ceiling."""
    copies: list[CopyBound] = field(default_factory=list)
    """The memory bound at each allreduce size (runs with peers)."""
    peers: dict[str, str] = field(default_factory=dict)
    """Peers that ran: name -> library and version."""
    skipped_peers: list[str] = field(default_factory=list)
    """One line per requested peer that could not run, with how to install it."""

    @property
    def p2p_gbps(self) -> float | None:
        """The point-to-point ceiling, GB/s, if measured."""
        return self.p2p.gbps if self.p2p is not None else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        p2p = None
        if self.p2p is not None:
            p2p = {"nbytes": self.p2p.nbytes, "gbps": self.p2p.gbps,
                   "times_us": [t * 1e6 for t in self.p2p.times_s]}
        memcpy = None
        if self.memcpy is not None:
            memcpy = {"nbytes": self.memcpy.nbytes, "gbps": self.memcpy.gbps,
                      "times_us": [t * 1e6 for t in self.memcpy.times_s]}
        return {
            "schema": "scaledl.bench.collectives/1", "environment": self.environment,
            "config": self.config, "p2p": p2p, "memcpy": memcpy,
            "results": [m.to_dict(self.p2p_gbps) for m in self.measurements],
            "ratios_vs_native": native_ratios(self.measurements),
            "ratios_vs_torch": native_ratios(self.measurements, "torch", every_size=True),
            "calibration": self.calibration,
            "peers": self.peers, "skipped_peers": self.skipped_peers,
            "copies": [copy.to_dict() for copy in self.copies],
            "peer_rows": peer_rows(self.measurements, self.copies),
        }


def native_ratios(
    measurements: list[Measurement], baseline: str = "native", every_size: bool = False,
) -> list[dict[str, Any]]:
    """busbw of each algorithm over ``baseline``'s (``native``, or ``torch``: torch.distributed
    outside scaledl), at each collective's largest size or, with ``every_size``, at every size."""
    ratios = []
    for collective in dict.fromkeys(m.collective for m in measurements):
        rows = [m for m in measurements if m.collective == collective]
        sizes = sorted({m.nbytes for m in rows}) if every_size else [max(m.nbytes for m in rows)]
        for nbytes in sizes:
            at_size = {m.algorithm: m for m in rows if m.nbytes == nbytes}
            reference = at_size.get(baseline)
            if reference is None:
                continue
            for name, m in at_size.items():
                if name != baseline:
                    ratios.append({"collective": collective, "algorithm": name, "nbytes": nbytes,
                                   "busbw_ratio": reference.avg_us / m.avg_us})  # = busbw ratio
    return ratios


def peer_rows(
    measurements: list[Measurement], copies: list[CopyBound] | None = None,
) -> list[dict[str, Any]]:
    """Per collective, size and scaledl algorithm: its median time and busbw, each peer's median
    over it (``> 1``: scaledl faster), and for allreduce its busbw as a fraction of the memory
    bound (:class:`CopyBound`).  Empty when no peer ran."""
    bounds = {copy.nbytes: copy for copy in copies or []}
    rows = []
    for collective in dict.fromkeys(m.collective for m in measurements):
        at = [m for m in measurements if m.collective == collective]
        for nbytes in sorted({m.nbytes for m in at}):
            here = [m for m in at if m.nbytes == nbytes]
            peers = [m for m in here if m.peer]
            if not peers:
                continue
            bound = bounds.get(nbytes) if collective == "allreduce" else None
            if bound is not None and bound.allreduce_busbw_gbps <= 0:
                bound = None  # one rank: an allreduce moves nothing, so there is no bound
            for m in (m for m in here if not m.peer):
                rows.append({
                    "collective": collective, "nbytes": nbytes, "algorithm": m.algorithm,
                    "resolved": m.resolved, "median_us": m.median_us,
                    "busbw_gbps": _median_busbw(m),
                    "vs": {peer.algorithm: peer.median_us / m.median_us for peer in peers},
                    "peer_us": {peer.algorithm: peer.median_us for peer in peers},
                    "bound_fraction": (_median_busbw(m) / bound.allreduce_busbw_gbps
                                       if bound is not None else None),
                })
    return rows


def _median_busbw(m: Measurement) -> float:
    """busbw at the median time (the peers' table compares medians), GB/s."""
    return m.nbytes / (m.median_us * 1e-6) / 1e9 * busbw_factor(m.collective, m.world_size)


def write_json(report: BenchReport, path: Path) -> None:
    """Write the report as indented JSON (parent directories created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")


def report_from_dict(data: dict[str, Any]) -> BenchReport:
    """Rebuild a report from :meth:`BenchReport.to_dict` output (for plots of saved runs)."""
    measurements = [
        Measurement(r["collective"], r["algorithm"], r["nbytes"], r["world_size"],
                    tuple(t * 1e-6 for t in r["times_us"]), r.get("resolved"),
                    bool(r.get("peer", False)))
        for r in data["results"]
    ]
    copies = [CopyBound(c["nbytes"], c["world_size"], c["one_core_us"] * 1e-6,
                        c["all_ranks_us"] * 1e-6) for c in data.get("copies", [])]
    ceilings = [
        P2PResult(item["nbytes"], tuple(t * 1e-6 for t in item["times_us"])) if item else None
        for item in (data.get("p2p"), data.get("memcpy"))
    ]
    return BenchReport(data["environment"], data["config"], measurements, ceilings[0],
                       data.get("calibration"), ceilings[1], copies, data.get("peers", {}),
                       data.get("skipped_peers", []))


ITEMSIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
"""Bytes per element of each ``dtype`` a benchmark file may name."""

RERUN = "rerun `scaledl bench collectives --json` to write it again"
"""How an error about a broken benchmark file ends."""
COLLECTIVES = tuple(c.value for c in Collective)


@dataclass(frozen=True)
class BenchRow:
    """One result row of a benchmark file, checked (:func:`read_rows`)."""

    path: Path
    data: dict[str, Any]
    """The whole file."""
    itemsize: int
    where: str
    """``benchmark file F, results[i]``: how an error about the row starts."""
    collective: str
    algorithm: str
    ran: str
    """``resolved``, else ``algorithm``."""
    nbytes: int
    world_size: int
    median_s: float


def read_rows(paths: Sequence[Path]) -> list[BenchRow]:
    """Every result row of the benchmark files, each checked (ValueError naming the file, the
    row and the bad value)."""
    rows = []
    for path in map(Path, paths):
        data = _read_bench(path)
        itemsize, results = _itemsize(data, path), data.get("results", [])
        if not isinstance(results, list):
            raise ValueError(f"benchmark file {path}: results {_shown(results)} must be a list "
                             f"of result objects; {RERUN}")
        rows += [_checked_row(path, data, itemsize, index, row)
                 for index, row in enumerate(results)]
    return rows


def _read_bench(path: Path) -> dict[str, Any]:
    """The JSON object of a ``scaledl bench collectives --json`` file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(f"cannot read benchmark file {path}: {reason}") from None
    if not isinstance(data, dict) or \
            not str(data.get("schema", "")).startswith("scaledl.bench.collectives"):
        raise ValueError(f"{path} is not `scaledl bench collectives --json` output")
    for key in ("config", "environment"):
        if not is_object(data.get(key) or {}):
            raise ValueError(f"benchmark file {path}: {key} {_shown(data[key])} must be an "
                             f"object; {RERUN}")
    return data


def _itemsize(data: dict[str, Any], path: Path) -> int:
    """Bytes per element of the file's ``dtype`` (float32 when it does not say)."""
    dtype = (data.get("config") or {}).get("dtype", "float32")
    if not isinstance(dtype, str) or dtype not in ITEMSIZES:
        raise ValueError(f"benchmark file {path}: config dtype {_shown(dtype)} is not one of "
                         f"{', '.join(ITEMSIZES)}; {RERUN}")
    return ITEMSIZES[dtype]


def _checked_row(path: Path, data: dict[str, Any], itemsize: int, index: int, row: object
                 ) -> BenchRow:
    """Result row ``index`` of ``path``, its fields checked."""
    where = f"benchmark file {path}, results[{index}]"
    if not isinstance(row, dict):
        raise ValueError(f"{where}: {_shown(row)} is not a result object; {RERUN}")

    def field(key: str, ok: Callable[[Any], bool], what: str) -> Any:
        if key not in row:
            raise ValueError(f"{where}: {key} is missing; {RERUN}")
        if not ok(row[key]):
            raise ValueError(f"{where}: {key} {_shown(row[key])} must be {what}; {RERUN}")
        return row[key]

    algorithm = field("algorithm", lambda v: isinstance(v, str) and v != "", "a name")
    resolved = row.get("resolved")
    if resolved is not None and not isinstance(resolved, str):
        raise ValueError(f"{where}: resolved {_shown(resolved)} must be an algorithm name or "
                         f"null; {RERUN}")
    return BenchRow(
        path, data, itemsize, where,
        field("collective", lambda v: v in COLLECTIVES, f"one of {', '.join(COLLECTIVES)}"),
        algorithm, resolved or algorithm,
        field("nbytes", lambda v: is_whole(v) and v >= 0, "a whole number >= 0"),
        field("world_size", lambda v: is_whole(v) and v >= 1, "a whole number >= 1"),
        field("median_us", is_duration, "a finite number > 0 (microseconds)") * 1e-6)


def _shown(value: object) -> str:
    """How a value appears in this file's errors: Python's ``repr``, cut short."""
    return shown(value, repr)


def row_topologies(row: BenchRow, override: str | None, placement: str
                   ) -> tuple[Topology, Topology]:
    """(the topology ``row``'s plans were made for, where its ranks really sat): ``override``
    (``--bench-topology``), else the file's; ValueError naming the row when they do not fit."""
    try:
        return _topologies(row.data, row.world_size, override, placement)
    except ValueError as error:
        raise ValueError(f"{row.where}: {error} (--bench-topology gives the layout the file "
                         "was measured on)") from None


def _topologies(
    data: dict[str, Any], world_size: int, override: str | None, placement: str
) -> tuple[Topology, Topology]:
    """(the topology the plans were made for, where the ranks really sat)."""
    spec = override or (data.get("config") or {}).get("topology") or \
        (data.get("environment") or {}).get("topology") or str(world_size)
    topo = Topology.parse(str(spec), world_size)
    if placement == "block":
        return topo, topo
    if placement != "cyclic":
        raise ValueError(f"placement {placement!r} is not block or cyclic")
    per_host, hosts = topo.axes[0], world_size // topo.axes[0]
    # cyclic: rank r on host r % hosts, so grid position (host, local) holds local * hosts + host
    order = tuple(local * hosts + host for host in range(hosts) for local in range(per_host))
    return topo, Topology(topo.axes, order=order, explicit=True)
