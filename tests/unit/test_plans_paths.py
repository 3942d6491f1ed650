"""Plans with a path per level, on thread-ranks: stages meet the reference stage runner.

Every combination of level paths of hierarchical and torus, every collective they implement,
every layout of 2..8 ranks, awkward element counts, and sizes large enough for the pipelined
hierarchical allreduce (several segments).  The shared-memory and backend stages themselves are
tested on processes (tests/distributed/test_stage_paths.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from scaledl.collectives import registry, torus
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.registry import ALGORITHMS
from scaledl.collectives.schedule import Collective
from tests.helpers_loopback import expected, rank_input, run_loopback, topologies

PATHS = ("p2p", "shm", "native")
SPECS = [f"{name}[{a},{b}]" for name in ("hierarchical", "torus")
         for a, b in itertools.product(PATHS, PATHS)]
SPECS += ["hierarchical[shm,halving_doubling]", "hierarchical[native,tree]"]


def _cases() -> list[tuple[str, Collective]]:
    cases = []
    for spec in SPECS:
        base = spec.partition("[")[0]
        for collective in sorted(ALGORITHMS[base].supports, key=lambda c: c.value):
            if "halving" in spec or "tree" in spec:
                if collective is not Collective.ALLREDUCE:
                    continue
            cases.append((spec, collective))
    return cases


@pytest.mark.parametrize(("spec", "collective"), _cases())
def test_level_paths_give_exact_results(spec: str, collective: Collective) -> None:
    for p in (2, 4, 6):
        for topology in topologies(p)[1:]:
            for numel in (1, p + 1, 1000):
                root = p - 1
                results = run_loopback(collective, spec, topology, numel, root=root,
                                       chunk_numel=61)
                if collective is Collective.ALLREDUCE or collective is Collective.REDUCE:
                    want = expected(ReduceOp.SUM, p, numel, torch.float64)
                    ranks = range(p) if collective is Collective.ALLREDUCE else [root]
                    for rank in ranks:
                        torch.testing.assert_close(results[rank], want, rtol=0, atol=0)
                elif collective is Collective.BROADCAST:
                    for rank in range(p):
                        torch.testing.assert_close(results[rank], rank_input(root, numel))
                elif collective is Collective.REDUCE_SCATTER:
                    full = expected(ReduceOp.SUM, p, numel * p, torch.float64)
                    for rank in range(p):
                        torch.testing.assert_close(results[rank],
                                                   full[rank * numel:(rank + 1) * numel])
                else:
                    want = torch.arange(1, p + 1, dtype=torch.float64).repeat_interleave(numel)
                    for rank in range(p):
                        torch.testing.assert_close(results[rank], want)


@pytest.mark.parametrize("spec", ["hierarchical[shm,p2p]", "hierarchical[native,native]",
                                  "hierarchical[shm,halving_doubling]", "torus[shm,p2p]",
                                  "torus[native,shm]"])
def test_pipelined_allreduce_is_exact(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torus, "SEGMENT_NUMEL", 64)  # pipeline small buffers
    registry.plan.cache_clear()
    try:
        for topology in topologies(4)[1:] + topologies(8)[1:3]:
            p = topology.world_size
            numel = 5 * 64 + 3  # five segments, an uneven last one
            schedule = registry.plan(spec, Collective.ALLREDUCE, topology, 0, numel)
            if topology.axes[0] > 1:  # the host level runs as stages: one per segment and way
                assert sum(1 for _ in schedule.stages()) >= 10
            results = run_loopback(Collective.ALLREDUCE, spec, topology, numel, chunk_numel=7)
            want = expected(ReduceOp.SUM, p, numel, torch.float64)
            for result in results:
                torch.testing.assert_close(result, want, rtol=0, atol=0)
    finally:
        registry.plan.cache_clear()


def test_shm_across_hosts_names_the_hosts_and_what_to_use() -> None:
    """The run-time refusal of a whole-group shm across hosts says how many hosts and offers
    auto; a caller with other choices (the simulator) names its own."""
    from scaledl.collectives.auto import Fabric, check_paths
    from scaledl.collectives.schedule import Collective
    from scaledl.topology import Topology

    topo = Topology.parse("2x2", 4)
    fabric = Fabric((0, 0, 1, 1))
    with pytest.raises(ValueError, match="spans 2 hosts; use 'auto', 'ring', or shm inside"):
        check_paths("shm", Collective.ALLREDUCE, topo, fabric)
    with pytest.raises(ValueError, match="no shared-memory path"):
        check_paths("shm", Collective.ALLREDUCE, topo, Fabric(None))
    with pytest.raises(ValueError, match="spans 2 hosts; use ring"):
        check_paths("shm", Collective.ALLREDUCE, topo, fabric, alternatives="ring")
