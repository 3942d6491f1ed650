"""The algorithm registry: which algorithms exist, what each implements, and planning."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

from scaledl.collectives import (
    chain, halving_doubling, hierarchical, multiring, native, ring, shm, torus, tree,
)
from scaledl.collectives.schedule import Collective, Schedule
from scaledl.topology import Topology

__all__ = [
    "Algorithm", "ALGORITHMS", "AUTO", "available", "lookup", "plan", "parse_collective",
    "plan_numel", "parse_algorithm", "LEVEL_PATHS",
]

AUTO = "auto"
LEVEL_PATHS = ("p2p", "ring", "halving_doubling", "tree", "shm", "native")
"""What a level of ``hierarchical[..]`` or ``torus[..]`` may run on."""


@dataclass(frozen=True)
class Algorithm:
    """One collective algorithm: its name, the collectives it implements, how to plan it."""

    name: str
    supports: frozenset[Collective]
    needs_topology: bool
    planner: Callable[..., Schedule] | None
    """``plan(collective, topology, rank, numel, root)``; None for ``native``."""
    summary: str
    needs_shm: bool = False
    """Only for groups whose ranks share one host's memory."""
    levels: bool = False
    """Each topology level can run on its own path (``name[path,path]``)."""

    @property
    def scheduled(self) -> bool:
        """True when the algorithm is a scaledl schedule (everything but ``native``)."""
        return self.planner is not None


def _entry(name: str, module: ModuleType) -> Algorithm:
    doc = (module.__doc__ or name).strip().splitlines()[0]
    planner = getattr(module, "plan", None)
    return Algorithm(name, module.SUPPORTS, module.NEEDS_TOPOLOGY, planner, doc,
                     getattr(module, "NEEDS_SHM", False), getattr(module, "LEVELS", False))


ALGORITHMS: dict[str, Algorithm] = {
    "ring": _entry("ring", ring),
    "multiring": _entry("multiring", multiring),
    "halving_doubling": _entry("halving_doubling", halving_doubling),
    "tree": _entry("tree", tree),
    "chain": _entry("chain", chain),
    "hierarchical": _entry("hierarchical", hierarchical),
    "torus": _entry("torus", torus),
    "shm": _entry("shm", shm),
    "native": _entry("native", native),
}


def parse_algorithm(spec: str) -> tuple[str, tuple[str, ...]]:
    """``"hierarchical[shm,ring]"`` -> ``("hierarchical", ("shm", "ring"))``; a plain name has
    no level paths."""
    if not isinstance(spec, str):
        raise TypeError(f"algorithm must be a name such as 'ring' or 'auto', got "
                        f"{type(spec).__name__} {spec!r}")
    name, bracket, rest = spec.partition("[")
    if not bracket:
        return spec, ()
    if not rest.endswith("]"):
        raise ValueError(f"algorithm {spec!r} is malformed; write e.g. 'hierarchical[shm,ring]'")
    paths = tuple(part.strip() for part in rest[:-1].split(","))
    unknown = [path for path in paths if path not in LEVEL_PATHS]
    if unknown or not paths:
        raise ValueError(f"algorithm {spec!r} names unknown level path {unknown[:1] or ['']}; "
                         f"each level runs on one of {', '.join(LEVEL_PATHS)}")
    return name, paths


def parse_collective(collective: str | Collective) -> Collective:
    """Accept ``"allreduce"`` or ``Collective.ALLREDUCE``."""
    try:
        return Collective(collective)
    except ValueError:
        names = ", ".join(c.value for c in Collective)
        raise ValueError(f"unknown collective {collective!r}; use one of: {names}") from None


def available(collective: str | Collective) -> list[str]:
    """Algorithm names that implement ``collective``, ``auto`` first."""
    wanted = parse_collective(collective)
    return [AUTO] + [name for name, algo in ALGORITHMS.items() if wanted in algo.supports]


def lookup(name: str, collective: str | Collective) -> Algorithm:
    """The algorithm ``name`` (optionally with level paths, ``torus[shm,ring]``) for
    ``collective``; ``ValueError`` listing the choices otherwise."""
    wanted = parse_collective(collective)
    base, paths = parse_algorithm(name)
    algo = ALGORITHMS.get(base)
    if algo is None or wanted not in algo.supports:
        choices = ", ".join(available(wanted))
        what = "unknown algorithm" if algo is None else "algorithm"
        extra = "" if algo is None else f" does not implement {wanted.value}"
        raise ValueError(f"{what} {name!r}{extra}; available for {wanted.value}: {choices}")
    if paths and not algo.levels:
        raise ValueError(f"algorithm {base!r} has no levels to choose paths for; only "
                         "hierarchical[..] and torus[..] take them")
    return algo


@lru_cache(maxsize=8192)
def plan(
    name: str, collective: Collective, topology: Topology, rank: int, numel: int, root: int = 0,
) -> Schedule:
    """The (cached) schedule of algorithm ``name`` (with its level paths, if any) for one rank."""
    algo = lookup(name, collective)
    if algo.planner is None:
        raise ValueError(f"{name} is not a scaledl schedule and cannot be planned")
    _, paths = parse_algorithm(name)
    if paths:
        return algo.planner(collective, topology, rank, numel, root, paths=paths)
    return algo.planner(collective, topology, rank, numel, root)


def plan_numel(collective: str, nbytes: int, world_size: int, itemsize: int) -> int:
    """Elements the plans of an ``nbytes`` collective are made for: the API plans reduce_scatter
    and allgather on one rank's shard, everything else on the whole buffer."""
    numel = nbytes // itemsize
    if collective in (Collective.REDUCE_SCATTER.value, Collective.ALLGATHER.value):
        return numel // world_size
    return numel
