"""``auto``: pick the algorithm per collective, message size and topology from a cost model.

The model is evaluated on the schedules themselves, not on closed forms: for each candidate
algorithm, each round of a rank's schedule costs

    overhead + max over its transfers (alpha[link] + bytes * beta[link])
             + reduction that the chunk pipeline cannot hide (gamma * one chunk)

where ``link`` is the outermost topology axis a transfer crosses (0 = inside a host).  Up to
``REPLAY_LIMIT`` ranks the prediction replays every rank's schedule together
(:mod:`scaledl.collectives.replay`), so time spent waiting for peers counts; beyond it, the
slowest of a fixed sample of ranks is used.  The inputs are the same on every rank, so every rank
makes the same choice.  ``native`` is modelled as the better of the ring and halving-doubling
schedules run
with Gloo's own (lower) per-round overhead and a measured bandwidth factor.

Parameters come from ``scaledl bench collectives --calibrate`` (a JSON file at
``$SCALEDL_CALIBRATION`` or ``~/.cache/scaledl/calibration.json``) or from defaults measured on
the project's 2-core machine over loopback.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scaledl.collectives.registry import ALGORITHMS, lookup, plan
from scaledl.collectives.replay import Link, replay
from scaledl.collectives.schedule import Action, Collective, Schedule
from scaledl.topology import Topology

__all__ = ["LinkModel", "CostModel", "Choice", "choose", "schedule_time", "calibration_path"]

CALIBRATION_ENV = "SCALEDL_CALIBRATION"


@dataclass(frozen=True)
class LinkModel:
    """One link class: latency ``alpha`` (seconds) and inverse bandwidth ``beta`` (s/byte)."""

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"link latency {self.alpha} and s/byte {self.beta} must be >= 0")


@dataclass(frozen=True)
class CostModel:
    """Parameters of the schedule cost model."""

    links: tuple[LinkModel, ...] = (LinkModel(40e-6, 1 / 3.0e9), LinkModel(60e-6, 1 / 1.25e9))
    """One model per topology axis, innermost first; outer axes reuse the last entry.  Defaults:
    loopback TCP on the project's 2-core machine inside a host, 10 Gbit/s Ethernet between."""
    overhead: float = 40e-6
    """Software cost of one round of scaledl's executor, seconds."""
    gamma: float = 1 / 8e9
    """Reduction cost, seconds per byte."""
    chunk_bytes: int = 1 << 20
    """Pipelining chunk of the executor."""
    native_overhead: float = 10e-6
    """Per-round cost of the backend's own collectives, seconds."""
    native_beta_factor: float = 1.3
    """How much slower the backend's own collectives move bytes than scaledl's pipeline."""

    def link(self, axis: int) -> LinkModel:
        """The model of a link that crosses ``axis``."""
        return self.links[min(max(axis, 0), len(self.links) - 1)]

    def to_json(self) -> str:
        """Serialise (``from_json`` reads it back)."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> CostModel:
        """Parse a calibration file."""
        data = json.loads(text)
        links = tuple(LinkModel(**link) for link in data.pop("links"))
        return cls(links=links, **data)

    @classmethod
    def load(cls, path: Path | None = None) -> CostModel:
        """The calibration at ``path`` (default location if None), or the defaults."""
        target = path if path is not None else calibration_path()
        if target.is_file():
            try:
                return cls.from_json(target.read_text())
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(
                    f"calibration file {target} is unreadable ({error}); delete it or rerun "
                    "`scaledl bench collectives --calibrate`"
                ) from None
        return cls()


def calibration_path() -> Path:
    """Where calibration is read from and written to."""
    explicit = os.environ.get(CALIBRATION_ENV)
    if explicit:
        return Path(explicit)
    return Path.home() / ".cache" / "scaledl" / "calibration.json"


def schedule_time(
    schedule: Schedule, topology: Topology, itemsize: int, model: CostModel,
    overhead: float | None = None, beta_factor: float = 1.0,
) -> float:
    """Predicted seconds for one rank's schedule."""
    per_round = model.overhead if overhead is None else overhead
    total = 0.0
    for round_ in schedule.rounds:
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
) -> float:
    per_round = model.overhead if overhead is None else overhead
    p = topology.world_size
    if p <= REPLAY_LIMIT:
        schedules = [plan(name, collective, topology, rank, numel, root) for rank in range(p)]

        def link_of(a: int, b: int) -> Link:
            link = model.link(topology.link_axis(a, b))
            return Link(link.alpha, link.beta * beta_factor)

        return replay(
            schedules, link_of, itemsize, per_round, model.gamma, model.chunk_bytes, topology.node
        ).makespan
    return max(
        schedule_time(
            plan(name, collective, topology, rank, numel, root), topology, itemsize, model,
            overhead, beta_factor,
        )
        for rank in _sample_ranks(p)
    )


def _native_time(
    collective: Collective, topology: Topology, numel: int, itemsize: int, model: CostModel,
    root: int,
) -> float:
    """The backend's own collective, modelled on scaledl schedules with its overhead.

    Gloo runs reduce_scatter as a whole allreduce followed by a copy, so it is costed as one.
    """
    proxies: tuple[str, ...] = ("ring", "halving_doubling")
    target, count = collective, numel
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        proxies = ("tree",)
    elif collective is Collective.REDUCE_SCATTER:
        target, count = Collective.ALLREDUCE, numel * topology.world_size
    return min(
        _predict(proxy, target, topology, count, itemsize, model, root,
                 model.native_overhead, model.native_beta_factor)
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
            lines.append(f"  {name:18s} {seconds * 1e6:12.1f} us predicted")
        return "\n".join(lines)


def choose(
    collective: Collective, topology: Topology, numel: int, itemsize: int,
    model: CostModel | None = None, root: int = 0, include_native: bool = True,
) -> Choice:
    """Predict every applicable algorithm and pick the fastest."""
    model = model if model is not None else CostModel()
    predictions: dict[str, float] = {}
    for name, algo in ALGORITHMS.items():
        if collective not in algo.supports or not algo.scheduled:
            continue
        if algo.needs_topology and not topology.explicit:
            continue
        if name in UNDERESTIMATED_WITHOUT_REPLAY and topology.world_size > REPLAY_LIMIT:
            continue
        predictions[name] = _predict(name, collective, topology, numel, itemsize, model, root)
    if include_native:
        predictions["native"] = _native_time(collective, topology, numel, itemsize, model, root)
    order = list(ALGORITHMS)
    best = min(predictions, key=lambda name: (predictions[name], order.index(name)))
    lookup(best, collective)
    return Choice(best, predictions)
