"""A peer's files are removed as soon as every rank has opened every peer, before anything is
timed: DeepSpeed's op never unlinks its 66 MiB file per rank, and a run killed while timing
(Ctrl-C under mpiexec is SIGTERM to the ranks; a rank inside DeepSpeed's wait runs no Python
handler) used to leave them in /dev/shm, a new name per run under torchrun."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import run_ranks

pytestmark = pytest.mark.distributed


def _bench_with_a_recording_peer(rank: int, world_size: int) -> list[Any]:
    import torch.distributed as dist

    from scaledl.bench import collectives
    from scaledl.bench.collectives import BenchConfig, run_benchmark
    from scaledl.bench.peers import Peer
    from scaledl.collectives.schedule import Collective
    from scaledl.topology import Topology

    events: list[Any] = []

    def make(collective: Collective, full: Any, part: Any) -> Any:
        def call() -> None:
            events.append("timed")
            dist.all_reduce(full)
        return call

    peer = Peer("gloo", "recording", make, close=lambda: events.append("closed"))
    collectives.open_peers = lambda names, one_host: ([peer], [])  # type: ignore[assignment]
    config = BenchConfig({Collective.ALLREDUCE: ("native",)}, (4096,), iters=2, warmup=1,
                         peers=("gloo",))
    run_benchmark(config, Topology.parse(str(world_size), rank=rank))
    return events


def test_peers_are_closed_before_anything_is_timed() -> None:
    for events in run_ranks(2, _bench_with_a_recording_peer, timeout=120):
        assert events[0] == "closed" and "timed" in events, events
