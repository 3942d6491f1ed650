"""The parameter server's wire protocol under skewed schedules: random delays before and after
every post and wait of every request, payload and reply (``SCALEDL_WIRE_JITTER``), random
sequences of every request kind (push through a step or the link, exchange, pull, state, a
request the server must reject, done; ``tests/ps_schedules.py``), every reply checked exactly
against a replay of the shard's updates in version order, on 2, 3 and 4 ranks, with the server
thread beside rank 0 and with one to three dedicated server ranks (one shard each).
Beside them, the skew no random delay of milliseconds reaches: a shard server that starts
serving several timeouts after the others.

A short seeded version of ``benchmarks/reliability/ps_soak.py``.  A hang fails within the
harness's timeout (and every wait of the protocol gives up after ``ps_schedules.TIMEOUT_S``).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from scaledl.strategies.async_sgd import AsyncSGD
from scaledl.transport.direct import WIRE_JITTER_ENV, DirectTransport
from tests import ps_schedules
from tests.harness import run_ranks
from tests.ps_schedules import Config

pytestmark = pytest.mark.distributed

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
RUNS = {
    2: [Config("async-sgd", 0, 7, F32), Config("async-easgd", 1, 3, F64),
        Config("async-msgd", 1, 2, BF16)],
    3: [Config("async-msgd", 0, 1000, F64), Config("async-sgd", 2, 7, F32),
        Config("hogwild-sgd", 1, 64, F16), Config("async-easgd", 0, 64, F64),
        Config("async-sgd", 1, 1, BF16)],
    4: [Config("async-easgd", 2, 7, F64), Config("async-sgd", 3, 3, F32),
        Config("hogwild-easgd", 0, 2, BF16), Config("async-msgd", 2, 64, F16),
        Config("async-sgd", 0, 1000, F32)],
}
"""Every rule, locked and Hogwild, the server thread and 1-3 dedicated servers, every dtype."""
CALLS = 40
SLOW_TIMEOUT_S = 1.0
"""The servers' deadline in the late-shard case (the late server starts two of them late)."""


def _slow_first_shard(rank: int, world_size: int) -> dict[str, Any]:
    """One worker, two shard servers; the first shard's server starts serving two deadlines late
    (as one still loading a checkpoint would).  The worker's first PULL waits for it without a
    deadline; the second shard's reply must wait too, not time out and drop the worker."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    dist.barrier()  # the ranks start the job together (their start-up skew is seconds)
    strategy = AsyncSGD(model, optimizer, servers=2, timeout_s=30.0)
    out = torch.full_like(strategy.flat, float("nan"))
    versions: list[int] = []
    if strategy.is_worker:
        versions = strategy.link.pull(out)
        strategy.finish()
    else:
        assert strategy.shard_server is not None
        strategy.shard_server.timeout_s = SLOW_TIMEOUT_S  # short deadlines on the wire only
        if rank == 1:
            time.sleep(2 * SLOW_TIMEOUT_S)
        strategy.serve()
    dropped = strategy.dropped_workers
    strategy.close()
    return {"pulled": bool(torch.equal(out, strategy.flat)), "versions": versions,
            "dropped": dropped}


def _job(rank: int, world_size: int, seed: int) -> dict[str, Any]:
    """On 3 ranks the late-shard case first, then the random requests of ``RUNS``."""
    late = _slow_first_shard(rank, world_size) if world_size == 3 else None
    return {**ps_schedules.run(rank, world_size, seed, CALLS, RUNS[world_size]), "late": late}


@functools.cache
def _results(world_size: int) -> tuple[dict[str, Any], ...]:
    """Every rank's result on ``world_size`` ranks (one set of processes for the tests of that
    size: their start-up, mostly torch.optim's first import of torch._dynamo, dominates)."""
    seed = 20 + world_size
    return tuple(run_ranks(world_size, _job, seed, timeout=120,
                           env={WIRE_JITTER_ENV: f"{seed}:1:0.3"}))


@pytest.mark.parametrize("world_size", sorted(RUNS))
def test_random_requests_with_random_delays_are_exact(world_size: int) -> None:
    results = _results(world_size)
    assert [f for result in results for f in result["failures"]] == []
    configs = RUNS[world_size]
    assert results[0]["requests"] == sum(  # every request and DONE of every worker
        ps_schedules.worker_calls(w, world_size - c.servers, CALLS) + 1
        for c in configs for w in range(world_size - c.servers))
    assert set(results[0]["kinds"]) == {"push", "exchange", "pull", "state", "rejected"}
    for rank, result in enumerate(results):  # every rank's wire (link or server) was delayed
        for config, pauses in zip(configs, result["pauses"]):
            assert pauses > 4, (rank, config, pauses)


def test_a_late_shard_does_not_make_the_others_drop_the_worker() -> None:
    late = [result["late"] for result in _results(3)]
    assert late[0]["pulled"] and late[0]["versions"] == [0, 0]
    assert [r["dropped"] for r in late] == [[], [], []]


def test_wire_jitter_is_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WIRE_JITTER_ENV, raising=False)
    assert DirectTransport(None).jitter is None  # type: ignore[arg-type]
    monkeypatch.setenv(WIRE_JITTER_ENV, "5:0.5:0.25")
    jitter = DirectTransport(None).jitter  # type: ignore[arg-type]
    assert jitter is not None and jitter.probability == 0.25 and jitter.seed == 5
    monkeypatch.setenv(WIRE_JITTER_ENV, "5")
    with pytest.raises(ValueError, match=WIRE_JITTER_ENV):
        DirectTransport(None)  # type: ignore[arg-type]


def test_drawn_configs_cover_every_strategy_and_server_count() -> None:
    configs = ps_schedules.draw_configs(4, seed=3, count=20)
    assert {(c.strategy, c.servers) for c in configs} == {
        (name, servers) for name in ps_schedules.STRATEGIES for servers in range(4)}
    assert all(c.numel >= c.servers for c in configs)
