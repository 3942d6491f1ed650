"""scaledl.collectives.api.resolve_algorithm: the algorithm a call runs, paths per level
included, as the bench records it."""

from __future__ import annotations

import pytest

from scaledl.collectives.api import resolve_algorithm
from scaledl.collectives.registry import parse_algorithm
from scaledl.topology import Topology
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


def _resolve(rank: int, world_size: int) -> tuple[str, str, str]:
    topo = Topology.parse("2x1", world_size)
    levelled = resolve_algorithm("allreduce", 1 << 18, algorithm="hierarchical", topology=topo)
    again = resolve_algorithm("allreduce", 1 << 18, algorithm="hierarchical", topology=topo)
    assert levelled == again
    return (levelled, resolve_algorithm("allreduce", 1 << 18, algorithm="ring"),
            resolve_algorithm("allreduce", 1 << 18))


@pytest.mark.timeout(120)
def test_levelled_algorithms_resolve_to_their_paths_on_every_rank_alike() -> None:
    results = run_ranks(2, _resolve, timeout=90)
    assert results[0] == results[1]
    levelled, ring, chosen = results[0]
    base, paths = parse_algorithm(levelled)
    assert base == "hierarchical" and len(paths) == 2
    assert paths[0] == "shm"  # both ranks of the one host share its memory
    assert ring == "ring"
    assert chosen != "auto" and parse_algorithm(chosen)[0] in {
        "ring", "multiring", "halving_doubling", "tree", "shm", "native", "hierarchical"}
