"""``auto``: pick the algorithm per collective, message size and topology from a cost model.

The model (:mod:`scaledl.collectives.cost`) is evaluated on the schedules themselves, not on
closed forms.  Up to ``REPLAY_LIMIT`` ranks the prediction replays every rank's schedule together
(:mod:`scaledl.collectives.replay`), so time spent waiting for peers counts; beyond it, the
slowest of a fixed sample of ranks is used.  The inputs are the same on every rank, so every rank
makes the same choice.  ``native`` is modelled as the better of the ring and halving-doubling
schedules run with Gloo's own (lower) per-round overhead and a measured bandwidth factor.

Paths per level (BlueConnect): for ``hierarchical`` and ``torus`` each topology level may run on
point-to-point rounds, on shared memory (when every group of that level shares a host, as a
:class:`Fabric` says) or on the backend's own collective; each level's path is chosen by the
model, level by level (levels run one after the other, so their costs add), and the choice is
part of the algorithm's name, e.g. ``hierarchical[shm,ring]``.  On a group inside one host the
whole collective can also run on shared memory (``shm``), whose prediction includes its fixed
cost per call (the direct call path's for an allreduce, the planned path's otherwise) and the
regimes of shared memory: in the cache or beyond it, a core per rank or cores time-shared
(:func:`~scaledl.collectives.cost.shm_terms`).  When a host's ranks outnumber its cores, every
candidate's point-to-point rounds stretch by ranks per core too (:func:`host_contention`):
over loopback a round is CPU work; and bytes between ranks of one host move at memory's speed
beyond the cache, as shared memory's do (:func:`~scaledl.collectives.cost.memory_factor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scaledl.collectives.cost import (
    CALIBRATION_ENV, CostModel, LinkCost, calibration_path, memory_factor, schedule_time,
    shm_call_time, stage_time,
)
from scaledl.collectives.registry import ALGORITHMS, lookup, parse_algorithm, plan
from scaledl.collectives.replay import replay
from scaledl.collectives.schedule import Collective, Stage
from scaledl.topology import Topology

__all__ = [
    "LinkCost", "CostModel", "Choice", "Fabric", "choose", "choose_paths", "level_options",
    "check_paths", "CALIBRATION_ENV", "stage_time", "host_contention", "host_memory",
    "schedule_time", "calibration_path",
]


REPLAY_LIMIT = 64
"""Up to this many ranks, predictions replay every rank's schedule (critical path included);
beyond it, the slowest of a fixed sample of ranks is taken, which misses waiting time."""


UNDERESTIMATED_WITHOUT_REPLAY = frozenset({"chain"})
"""Pipelines whose per-rank time hides their end-to-end latency; not candidates past the limit."""


def _sample_ranks(world_size: int) -> list[int]:
    step = world_size / 8
    return sorted({0, world_size - 1} | {int(i * step) for i in range(8)})


def _predict(
    name: str, collective: Collective, topology: Topology, numel: int, itemsize: int,
    model: CostModel, root: int, overhead: float | None = None, beta_factor: float = 1.0,
    contention: float = 1.0, memory: float = 1.0,
) -> float:
    """Predicted seconds of ``name``; ``contention`` (ranks per core of a host whose ranks
    outnumber its cores) stretches the point-to-point rounds, all CPU work over loopback
    (shared-memory stages stretch themselves, :func:`~scaledl.collectives.cost.shm_terms`);
    ``memory`` (:func:`~scaledl.collectives.cost.memory_factor`) slows the bytes of links
    inside a host."""
    per_round = (model.overhead if overhead is None else overhead) * contention
    p = topology.world_size
    if p <= REPLAY_LIMIT:
        schedules = [plan(name, collective, topology, rank, numel, root) for rank in range(p)]

        def link_of(a: int, b: int) -> LinkCost:
            axis = topology.link_axis(a, b)
            link = model.link(axis)
            slow = memory if axis == 0 else 1.0
            return LinkCost(link.alpha * contention, link.beta * beta_factor * contention * slow)

        def stage_cost(stage: Stage, sharers: int) -> float:
            return stage_time(stage, itemsize, model, sharers)

        return replay(
            schedules, link_of, itemsize, per_round, model.gamma * contention, model.chunk_bytes,
            topology.node, stage_cost,
        ).makespan
    return contention * max(
        schedule_time(
            plan(name, collective, topology, rank, numel, root), topology, itemsize, model,
            overhead, beta_factor,
        )
        for rank in _sample_ranks(p)
    )


def _crowd(fabric: Fabric) -> int:
    """Ranks on the most crowded host of the group (1 when the hosts are unknown)."""
    if fabric.hosts is None:
        return 1
    return max(fabric.hosts.count(host) for host in set(fabric.hosts))


def host_contention(model: CostModel, fabric: Fabric) -> float:
    """Ranks per core of the most crowded host of the group (1 when each rank has a core, or
    the hosts are unknown): how much slower its ranks' CPU work runs."""
    return model.contention(_crowd(fabric))


def host_memory(model: CostModel, fabric: Fabric, collective: Collective, numel: int,
                itemsize: int, world_size: int) -> float:
    """:func:`~scaledl.collectives.cost.memory_factor` of a call: its buffers (the whole
    ``p x shard`` of reduce_scatter and allgather) on the most crowded host."""
    whole = numel * world_size if collective in (Collective.REDUCE_SCATTER,
                                                 Collective.ALLGATHER) else numel
    return memory_factor(model, _crowd(fabric) * whole * itemsize)


@dataclass(frozen=True)
class Fabric:
    """The paths a group can use besides point-to-point rounds."""

    hosts: tuple[int, ...] | None = None
    """Host of every rank (a digest) when shared memory joins the ranks of each host; None when
    the group has no shared-memory path."""
    native_stages: bool = False
    """The backend's own collectives can run on subgroups (``native`` stages)."""

    def shares_memory(self, members: Sequence[int]) -> bool:
        """True when every rank of ``members`` can reach the others' memory."""
        return self.hosts is not None and len({self.hosts[m] for m in members}) == 1

    @property
    def one_host(self) -> bool:
        """True when the whole group shares one host's memory."""
        return self.hosts is not None and self.shares_memory(range(len(self.hosts)))


def level_groups(name: str, topology: Topology) -> list[list[tuple[int, ...]]]:
    """The member groups at each level of a levelled algorithm, innermost level first."""
    if name == "torus":
        return [topology.axis_groups(axis) for axis in range(len(topology.axes))]
    nodes = [topology.node_ranks(node) for node in range(topology.num_nodes)]
    across = [tuple(node[local] for node in nodes) for local in range(topology.ranks_per_node)]
    return [nodes, across]


def level_options(
    name: str, collective: Collective, topology: Topology, fabric: Fabric,
) -> list[list[str]]:
    """The paths each level of ``name`` may take on ``fabric``."""
    options = []
    for level, groups in enumerate(level_groups(name, topology)):
        paths = ["p2p"]
        if name == "hierarchical" and level == 1 and collective is Collective.ALLREDUCE:
            paths += ["halving_doubling", "tree"]
        if all(fabric.shares_memory(group) for group in groups if len(group) > 1):
            paths.append("shm")
        if fabric.native_stages:
            paths.append("native")
        options.append(paths)
    return options


SHM_ALTERNATIVES = "'auto', 'ring', or shm inside a level (e.g. 'hierarchical[shm,ring]')"
"""What :func:`check_paths` suggests instead of a whole-group ``shm`` the group cannot run."""


def check_paths(algorithm: str, collective: Collective, topology: Topology, fabric: Fabric,
                alternatives: str = SHM_ALTERNATIVES) -> None:
    """Raise ``ValueError`` when ``algorithm`` needs a path the group does not have
    (``alternatives``: what to use instead of a whole-group shared-memory algorithm)."""
    base, paths = parse_algorithm(algorithm)
    if ALGORITHMS[base].needs_shm and not fabric.one_host:
        where = (f"the group spans {len(set(fabric.hosts))} hosts" if fabric.hosts is not None
                 else "the group has no shared-memory path (CPU tensors, Gloo, enough /dev/shm)")
        raise ValueError(f"algorithm {base!r} needs every rank of the group on one host with "
                         f"shared memory, and {where}; use {alternatives}")
    if not paths:
        return
    options = level_options(base, collective, topology, fabric)
    words = _level_words(base, len(options))
    if len(paths) > len(options):
        raise ValueError(
            f"{algorithm!r} names {len(paths)} level paths, and {base} has {len(options)} "
            f"levels on topology {topology.spec} ({', '.join(words)}); give at most one path "
            f"per level, innermost first, e.g. '{base}[{','.join(['ring'] * len(options))}]'")
    for level, path in enumerate(paths):
        allowed = list(dict.fromkeys(options[level] + ["ring"]))
        if path not in allowed:
            raise ValueError(
                f"level {level + 1} of {algorithm!r} ({words[level]}) cannot run on {path!r} "
                f"here; it may use {', '.join(allowed)} (shm needs every group of the level "
                "on one host)")


def _level_words(name: str, levels: int) -> list[str]:
    """What each level of ``name`` spans, in words: a host and across hosts for
    hierarchical, one axis of the topology each for torus."""
    if name == "hierarchical":
        return ["inside each host", "across hosts"][:levels]
    return [f"axis {axis + 1}" for axis in range(levels)]


def choose_paths(
    name: str, collective: Collective, topology: Topology, numel: int, itemsize: int,
    model: CostModel, fabric: Fabric, root: int = 0,
) -> tuple[str, float]:
    """The best level paths for ``name`` (``name[...]``) and its predicted seconds.

    Levels run one after another, so each level's path is chosen with the others kept at
    point-to-point rounds, then the winners are combined.
    """
    options = level_options(name, collective, topology, fabric)
    baseline = ["p2p"] * len(options)
    chosen = list(baseline)
    contention = host_contention(model, fabric)
    memory = host_memory(model, fabric, collective, numel, itemsize, topology.world_size)
    for level, paths in enumerate(options):
        if len(paths) == 1:
            continue
        timed = []
        for path in paths:
            trial = list(baseline)
            trial[level] = path
            spec = f"{name}[{','.join(trial)}]"
            timed.append((_predict(spec, collective, topology, numel, itemsize, model, root,
                                   contention=contention, memory=memory),
                          paths.index(path), path))
        chosen[level] = min(timed)[2]
    spec = name if chosen == baseline else f"{name}[{','.join(chosen)}]"
    return spec, _predict(spec, collective, topology, numel, itemsize, model, root,
                          contention=contention, memory=memory)


def _native_time(
    collective: Collective, topology: Topology, numel: int, itemsize: int, model: CostModel,
    root: int, contention: float = 1.0, memory: float = 1.0,
) -> float:
    """The backend's own collective, modelled on scaledl schedules with its overhead.

    Gloo runs reduce_scatter as a whole allreduce followed by a copy, so it is costed as one
    (``model.native_reduce_scatter_allreduce``; NCCL's own is costed as a reduce_scatter).
    """
    proxies: tuple[str, ...] = ("ring", "halving_doubling")
    target, count = collective, numel
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        proxies = ("tree",)
    elif collective is Collective.REDUCE_SCATTER and model.native_reduce_scatter_allreduce:
        target, count = Collective.ALLREDUCE, numel * topology.world_size
    return min(
        _predict(proxy, target, topology, count, itemsize, model, root,
                 model.native_overhead, model.native_beta_factor, contention, memory)
        for proxy in proxies
    )


@dataclass(frozen=True)
class Choice:
    """The algorithm ``auto`` picked and the predictions behind it."""

    algorithm: str
    predictions: dict[str, float] = field(default_factory=dict)
    """Predicted seconds per candidate."""

    def explain(self) -> str:
        """A short table of the candidates, fastest first."""
        lines = [f"auto chose {self.algorithm}:"]
        for name, seconds in sorted(self.predictions.items(), key=lambda item: item[1]):
            lines.append(f"  {name:28s} {seconds * 1e6:12.1f} us predicted")
        return "\n".join(lines)


def choose(
    collective: Collective, topology: Topology, numel: int, itemsize: int,
    model: CostModel | None = None, root: int = 0, include_native: bool = True,
    fabric: Fabric | None = None,
) -> Choice:
    """Predict every applicable algorithm (with its best level paths) and pick the fastest."""
    model = model if model is not None else CostModel()
    fabric = fabric if fabric is not None else Fabric()
    contention = host_contention(model, fabric)
    memory = host_memory(model, fabric, collective, numel, itemsize, topology.world_size)
    predictions: dict[str, float] = {}
    for name, algo in ALGORITHMS.items():
        if collective not in algo.supports or not algo.scheduled:
            continue
        if algo.needs_topology and not topology.explicit:
            continue
        if algo.needs_shm and not fabric.one_host:
            continue
        if name in UNDERESTIMATED_WITHOUT_REPLAY and topology.world_size > REPLAY_LIMIT:
            continue
        if algo.levels:
            spec, seconds = choose_paths(name, collective, topology, numel, itemsize, model,
                                         fabric, root)
            predictions[spec] = seconds
        else:
            predictions[name] = _predict(name, collective, topology, numel, itemsize, model, root,
                                         contention=contention, memory=memory)
        if algo.needs_shm:  # the whole group's call: its fixed cost weighs on small messages
            predictions[name] += shm_call_time(collective, topology.world_size, model)
    if include_native:
        predictions["native"] = _native_time(collective, topology, numel, itemsize, model, root,
                                             contention, memory)
    order = list(ALGORITHMS)

    def rank_of(name: str) -> tuple[float, int]:
        return predictions[name], order.index(name.partition("[")[0])

    best = min(predictions, key=rank_of)
    lookup(best, collective)
    return Choice(best, predictions)
