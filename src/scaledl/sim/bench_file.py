"""The result rows of ``scaledl bench collectives --json`` files, read and checked once.

:func:`read_rows` reads every row of the benchmark files and checks each field, so that a broken
file is one error naming the file, the row and the value, before any fit or replay
(:mod:`scaledl.sim.calibrate` reads the scheduled algorithms' rows through it,
:mod:`scaledl.sim.native` the backend's own).  :func:`row_topologies` gives the layout a row's
plans were made for and where its ranks sat.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaledl.collectives.schedule import Collective
from scaledl.sim.json_fields import is_duration, is_object, is_whole, shown
from scaledl.topology import Topology

__all__ = ["BenchRow", "read_rows", "row_topologies", "ITEMSIZES", "RERUN"]

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
