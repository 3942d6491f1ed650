"""``auto``: pick the algorithm per collective, message size and topology from a cost model.

The model is evaluated on the schedules themselves, not on closed forms: for each candidate
algorithm, each round of a rank's schedule costs

    overhead + max over its transfers (alpha[link] + bytes * beta[link])
             + reduction that the chunk pipeline cannot hide (gamma * one chunk)

where ``link`` is the outermost topology axis a transfer crosses (0 = inside a host).  The
prediction for an algorithm is the largest over a fixed set of ranks, so every rank makes the
same choice.  ``native`` is modelled as the better of the ring and halving-doubling schedules run
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

    links: tuple[LinkModel, ...] = (LinkModel(60e-6, 1 / 1.6e9), LinkModel(60e-6, 1 / 1.25e9))
    """One model per topology axis, innermost first; outer axes reuse the last entry."""
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
        for t in round_.transfers:
            link = model.link(topology.link_axis(schedule.rank, t.peer))
            wire = max(wire, link.alpha + t.numel * itemsize * link.beta * beta_factor)
            if t.action is Action.RECV_REDUCE:
                reduced += t.numel * itemsize
        hidden = max(wire, reduced * model.gamma)
        total += per_round + hidden + min(reduced, model.chunk_bytes) * model.gamma
    return total


def _sample_ranks(world_size: int) -> list[int]:
    if world_size <= 16:
        return list(range(world_size))
    step = world_size / 8
    return sorted({0, world_size - 1} | {int(i * step) for i in range(8)})


def _predict(
    name: str, collective: Collective, topology: Topology, numel: int, itemsize: int,
    model: CostModel, root: int, overhead: float | None = None, beta_factor: float = 1.0,
) -> float:
    return max(
        schedule_time(
            plan(name, collective, topology, rank, numel, root), topology, itemsize, model,
            overhead, beta_factor,
        )
        for rank in _sample_ranks(topology.world_size)
    )


def _native_proxy(collective: Collective) -> tuple[str, ...]:
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        return ("tree",)
    return ("ring", "halving_doubling")


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
        predictions[name] = _predict(name, collective, topology, numel, itemsize, model, root)
    if include_native:
        predictions["native"] = min(
            _predict(proxy, collective, topology, numel, itemsize, model, root,
                     model.native_overhead, model.native_beta_factor)
            for proxy in _native_proxy(collective)
        )
    best = min(predictions, key=lambda name: (predictions[name], name))
    lookup(best, collective)
    return Choice(best, predictions)
