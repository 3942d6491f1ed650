"""``native``'s per-round overhead and bandwidth factor for ``scaledl simulate calibrate``.

The fit itself is :mod:`scaledl.bench.fit`'s (the one ``scaledl bench collectives --calibrate``
runs); the layering rules keep ``sim`` from importing ``bench``, so the CLI passes it in as a
:data:`NativeFit`.  This module reads the native rows of the benchmark files (through
:func:`scaledl.sim.bench_file.read_rows`, which checks them) and picks the link the backend's
rounds wait on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scaledl.collectives.auto import CostModel
from scaledl.sim.bench_file import read_rows, row_topologies
from scaledl.topology import Topology

__all__ = ["Native", "NativeFit", "load_natives", "fit_native"]


@dataclass(frozen=True)
class Native:
    """One measured median of the backend's own collective, with the plans' topology."""

    collective: str
    nbytes: int
    world_size: int
    median_s: float
    planned: Topology
    itemsize: int


NativeFit = Callable[[Sequence[Native], Topology, int, CostModel], tuple[CostModel, dict[str, Any]]]
"""Fits ``native_overhead`` and ``native_beta_factor`` of a model to native measurements on one
topology and dtype; returns the model and a summary (``skipped`` when it could not fit)."""


def load_natives(paths: Sequence[Path], topology: str | None = None) -> list[Native]:
    """The ``native`` measurements of the benchmark files (planned topology as the bench's)."""
    return [Native(row.collective, row.nbytes, row.world_size, row.median_s,
                   row_topologies(row, topology, "block")[0], row.itemsize)
            for row in read_rows(paths) if row.algorithm == "native"]


def fit_native(natives: Sequence[Native], model: CostModel, fit: NativeFit
               ) -> tuple[CostModel, str]:
    """``model`` with ``native``'s overhead and bandwidth factor fitted by ``fit`` on the
    largest group of native measurements sharing a topology and dtype (``model`` unchanged, and
    why, when it could not fit)."""
    groups: dict[tuple[str, int], list[Native]] = {}
    for native in natives:
        groups.setdefault((native.planned.spec, native.itemsize), []).append(native)
    if not groups:
        return model, "native: not measured, prior kept"
    group = max(groups.values(), key=len)
    planned = group[0].planned
    # bench.fit normalises by links[0] (one host); across hosts the backend's ring-like rounds
    # wait on the outermost link crossed, so fit against that link and keep the real ones
    outer = max((axis for axis, size in enumerate(planned.axes) if size > 1), default=0)
    fitted, summary = fit(group, planned, group[0].itemsize,
                          replace(model, links=(model.link(outer),)))
    if "native_beta_factor" not in summary:
        return model, f"native: {summary.get('skipped', 'not fitted')}, prior kept"
    fitted = replace(model, native_overhead=fitted.native_overhead,
                     native_beta_factor=fitted.native_beta_factor)
    return fitted, (f"native: overhead {fitted.native_overhead * 1e6:.1f} us per round beyond "
                    f"alpha, bandwidth factor {fitted.native_beta_factor:.2f} "
                    f"({len(group)} measurements on {group[0].planned.spec})")
