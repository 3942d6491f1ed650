"""A shared-memory stage is CPU work: with more ranks than cores it stretches like CPU time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scaledl.collectives.cost import stage_time
from scaledl.collectives.registry import plan
from scaledl.collectives.schedule import Collective
from scaledl.sim.collective import compile_collective
from scaledl.sim.fastreplay import cost, evaluate
from scaledl.sim.presets import build_network
from scaledl.topology import Topology


def _seconds(algorithm: str, topology: Topology, contention: float, gamma: float = 7e-11) -> float:
    network = replace(build_network("1gbit", "loopback", gamma), cpu_contention=contention)
    compiled = compile_collective(algorithm, Collective.ALLREDUCE, topology, 1 << 20)
    return float(evaluate(compiled, cost(compiled, topology, network)).max())


def test_a_shared_memory_allreduce_takes_contention_times_longer() -> None:
    topo = Topology.parse("4")
    assert _seconds("shm", topo, 3.0) == pytest.approx(3 * _seconds("shm", topo, 1.0), rel=1e-12)


def test_only_the_shared_memory_level_stretches() -> None:
    """hierarchical[shm,ring] on 2x2: the shm stages triple, the ring across hosts (link-bound,
    no host CPU cost and, here, no reduction cost) does not."""
    topo = Topology.parse("2x2")
    quiet = _seconds("hierarchical[shm,ring]", topo, 1.0, gamma=0.0)
    busy = _seconds("hierarchical[shm,ring]", topo, 3.0, gamma=0.0)
    model = build_network("1gbit", "loopback", 0.0).to_cost_model()
    stages = [r.stage for r in plan("hierarchical[shm,ring]", Collective.ALLREDUCE, topo, 0,
                                    1 << 20).rounds if r.stage is not None]
    shm = sum(stage_time(s, 4, model, 1) for s in stages if s.path == "shm")
    assert len(stages) == 2 and shm > 0
    assert busy - quiet == pytest.approx(2 * shm, rel=1e-9)
