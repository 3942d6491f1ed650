"""The state ``hvd.init()`` creates: this rank's place in the job and the chosen algorithms.

Horovod's API is a set of module-level functions (``hvd.rank()``, ``hvd.allreduce(t)``), so this
one package keeps the job's state in a module-level :class:`Runtime`, installed by ``hvd.init()``
and removed by ``hvd.shutdown()``; the rest of scaledl passes its groups and topologies as
values.

The collective algorithm is chosen once, at ``hvd.init(algorithm=...)`` or from
``SCALEDL_HOROVOD_ALGORITHM``: one name (``ring``) applies to every collective that algorithm
implements and leaves the others on ``auto``; ``allreduce=ring,broadcast=tree`` names them one by
one.  The default is ``auto``: scaledl's cost model picks per call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING

from scaledl import collectives
from scaledl.topology import Topology

if TYPE_CHECKING:
    from scaledl.horovod.process_sets import ProcessSet

__all__ = ["ALGORITHM_ENV", "STEP_NEGOTIATION_ENV", "AUTO", "Algorithms", "Runtime", "current",
           "peek", "install", "step_negotiation"]

ALGORITHM_ENV = "SCALEDL_HOROVOD_ALGORITHM"
"""Environment variable choosing the collective algorithm(s) when ``hvd.init`` is given none."""
STEP_NEGOTIATION_ENV = "SCALEDL_HOROVOD_STEP_NEGOTIATION"
"""Set to 0 to skip the DistributedOptimizer's per-step negotiation round (faster small steps;
``hvd.join()`` during training and the mismatch check of optimizer steps are then lost)."""
AUTO = "auto"
_ALIASES = {"reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter"}


@dataclass(frozen=True)
class Algorithms:
    """The scaledl algorithm each kind of Horovod collective runs."""

    allreduce: str = AUTO
    """allreduce, grouped_allreduce and the DistributedOptimizer's gradient buckets."""
    broadcast: str = AUTO
    """broadcast, broadcast_parameters, broadcast_object, broadcast_optimizer_state."""
    allgather: str = AUTO
    """allgather (padded to the longest first dimension when the ranks' differ)."""
    reduce_scatter: str = AUTO
    """reducescatter (padded when the first dimension does not divide evenly)."""

    @classmethod
    def parse(cls, spec: str) -> Algorithms:
        """``"ring"`` or ``"allreduce=ring,broadcast=tree"``; ``ValueError`` naming a bad part."""
        spec = spec.strip() or AUTO
        names = [item.name for item in fields(cls)]
        if "=" not in spec:
            chosen = {c: spec if spec in collectives.available(c) else AUTO for c in names}
            if spec != AUTO and set(chosen.values()) == {AUTO}:
                known = ", ".join(sorted(collectives.ALGORITHMS))
                raise ValueError(f"algorithm {spec!r} is not a scaledl algorithm; use auto or one "
                                 f"of {known} (or allreduce=NAME,broadcast=NAME,...)")
            return cls(**chosen)
        chosen = {}
        for part in spec.split(","):
            key, _, name = (text.strip() for text in part.partition("="))
            key = _ALIASES.get(key, key)
            if key not in names or not name:
                raise ValueError(f"algorithm part {part.strip()!r} is not COLLECTIVE=NAME with a "
                                 f"collective among {', '.join(names)}")
            if name != AUTO:
                collectives.lookup(name, key)
            chosen[key] = name
        return cls(**chosen)

    def items(self) -> list[tuple[str, str]]:
        """``(collective, algorithm)`` pairs."""
        return [(item.name, getattr(self, item.name)) for item in fields(self)]

    def describe(self) -> str:
        """``allreduce=ring broadcast=auto ...``"""
        return " ".join(f"{c}={name}" for c, name in self.items())


@dataclass
class Runtime:
    """Where this process sits in the job, as ``hvd.init()`` found it."""

    rank: int
    """Rank in the job."""
    size: int
    """Number of ranks."""
    local_rank: int
    """Position among the ranks on this host."""
    local_size: int
    """Ranks on this host."""
    cross_rank: int
    """Index of this host."""
    cross_size: int
    """Number of hosts."""
    topology: Topology
    """The job's layout, from :func:`scaledl.init`."""
    algorithms: Algorithms
    """The algorithm of each collective."""
    backend: str
    """The default process group's backend (``gloo``, ``nccl``, ``mpi``)."""
    timeout: timedelta
    """Timeout of the groups ``hvd`` creates (process sets and their control groups)."""
    owns_world: bool
    """True when ``hvd.init()`` created the default process group (``shutdown`` destroys it)."""
    sets: dict[int, ProcessSet] = field(default_factory=dict)
    """Registered process sets by id, the global one (0) included."""
    next_set_id: int = 1
    """Id of the next process set added."""


_RUNTIME: Runtime | None = None


def current() -> Runtime:
    """The runtime; ``ValueError`` when ``hvd.init()`` has not run."""
    if _RUNTIME is None:
        raise ValueError("scaledl.horovod is not initialized; call hvd.init() first")
    return _RUNTIME


def peek() -> Runtime | None:
    """The runtime, or ``None`` before ``hvd.init()``."""
    return _RUNTIME


def install(runtime: Runtime | None) -> None:
    """Make ``runtime`` the current one (``None``: not initialized)."""
    global _RUNTIME
    _RUNTIME = runtime


def step_negotiation() -> bool:
    """Whether DistributedOptimizer steps negotiate (``SCALEDL_HOROVOD_STEP_NEGOTIATION``)."""
    value = os.environ.get(STEP_NEGOTIATION_ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise ValueError(f"{STEP_NEGOTIATION_ENV}={value!r} must be 1 (default) or 0")
    return value != "0"
