"""A peer's files are removed as soon as every rank has opened every peer, before anything is
timed: DeepSpeed's op never unlinks its 66 MiB file per rank, and a run killed while timing
(Ctrl-C under mpiexec is SIGTERM to the ranks; a rank inside DeepSpeed's wait runs no Python
handler) used to leave them in /dev/shm, a new name per run under torchrun."""

from __future__ import annotations

import time
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
            events.append(("timed", time.monotonic()))
            dist.all_reduce(full)
        return call

    def opened(names: object, one_host: object) -> tuple[list[Peer], list[str]]:
        events.append(("opened", time.monotonic()))  # one clock for every process of the host
        return [Peer("gloo", "recording", make,
                     close=lambda: events.append(("closed", time.monotonic())))], []

    collectives.open_peers = opened  # type: ignore[assignment]
    config = BenchConfig({Collective.ALLREDUCE: ("native",)}, (4096,), iters=2, warmup=1,
                         peers=("gloo",))
    run_benchmark(config, Topology.parse(str(world_size), rank=rank))
    return events


def test_peers_are_closed_once_every_rank_opened_them_and_before_anything_is_timed() -> None:
    ranks = run_ranks(2, _bench_with_a_recording_peer, timeout=120)
    for events in ranks:
        kinds = [kind for kind, _ in events]
        assert kinds[:2] == ["opened", "closed"] and "timed" in kinds, kinds
    last_open = max(at for events in ranks for kind, at in events if kind == "opened")
    first_close = min(at for events in ranks for kind, at in events if kind == "closed")
    assert last_open <= first_close  # no rank removes a file before every rank has opened
