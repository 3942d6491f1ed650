"""The parameter server's wire protocol under skewed schedules: random delays before and after
every post and wait of every request, payload and reply (``SCALEDL_WIRE_JITTER``), random
sequences of every request kind (push through a step or the link, exchange, pull, state, a
request the server must reject, done; ``tests/ps_schedules.py``), every reply checked exactly
against a replay of the shard's updates in version order, on 3 and 4 ranks (2 in the soak), with
the server thread beside rank 0 and with one to three dedicated server ranks (one shard each).
Beside them, the skew no random delay of milliseconds reaches: a shard server that starts
serving several timeouts after the others.

A short seeded version of ``benchmarks/reliability/ps_soak.py``.  A hang fails within the
harness's timeout (and every wait of the protocol gives up after ``ps_schedules.TIMEOUT_S``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from scaledl.strategies.async_sgd import AsyncSGD
from scaledl.transport.direct import WIRE_JITTER_ENV, DirectTransport
from tests import ps_schedules
from tests.harness import run_ranks
from tests.ps_schedules import Config

pytestmark = pytest.mark.distributed

F32, F64, F16, BF16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
RUNS = {
    3: [Config("async-msgd", 0, 1000, F64), Config("async-sgd", 2, 7, F32),
        Config("hogwild-sgd", 1, 64, F16), Config("async-easgd", 0, 64, F64),
        Config("async-sgd", 1, 1, BF16)],
    4: [Config("async-easgd", 2, 7, F64), Config("async-sgd", 3, 3, F32),
        Config("hogwild-easgd", 0, 2, BF16), Config("async-msgd", 2, 64, F16),
        Config("async-sgd", 0, 1000, F32)],
}
"""Every rule, locked and Hogwild, the server thread and 1-3 dedicated servers, every dtype.
Two ranks (one worker, or the thread and one remote worker) are left to the soak: each process
set costs some 15 s of start-up (Gloo, and torch.optim's first import of torch._dynamo) on a
loaded 2-core machine, against under a second of requests."""
SLOW_TIMEOUT_S = 1.5
"""The deadline of the late-shard test (the late server starts three of them late)."""


@pytest.mark.parametrize("world_size", sorted(RUNS))
def test_random_requests_with_random_delays_are_exact(world_size: int) -> None:
    seed, calls = 20 + world_size, 40
    env = {WIRE_JITTER_ENV: f"{seed}:1:0.3"}
    results = run_ranks(world_size, ps_schedules.run, seed, calls, RUNS[world_size],
                        timeout=120, env=env)
    assert [f for result in results for f in result["failures"]] == []
    configs = RUNS[world_size]
    assert results[0]["requests"] == sum(  # every request and DONE of every worker
        ps_schedules.worker_calls(w, world_size - c.servers, calls) + 1
        for c in configs for w in range(world_size - c.servers))
    assert set(results[0]["kinds"]) == {"push", "exchange", "pull", "state", "rejected"}
    for rank, result in enumerate(results):  # every rank's wire (link or server) was delayed
        for config, pauses in zip(configs, result["pauses"]):
            assert pauses > 4, (rank, config, pauses)


def _slow_first_shard(rank: int, world_size: int) -> dict[str, Any]:
    """One worker, two shard servers; the first shard's server starts serving 3 timeouts late (as
    one still loading a checkpoint would).  The worker's first PULL waits for it without a
    deadline; the second shard's reply must wait too, not time out and drop the worker."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    strategy = AsyncSGD(model, torch.optim.SGD(model.parameters(), lr=0.5), servers=2,
                        timeout_s=SLOW_TIMEOUT_S)
    out = torch.full_like(strategy.flat, float("nan"))
    versions: list[int] = []
    if strategy.is_worker:
        versions = strategy.link.pull(out)
        strategy.finish()
    else:
        if rank == 1:
            time.sleep(3 * SLOW_TIMEOUT_S)
        strategy.serve()
    dropped = strategy.dropped_workers
    strategy.close()
    return {"pulled": bool(torch.equal(out, strategy.flat)), "versions": versions,
            "dropped": dropped}


def test_a_late_shard_does_not_make_the_others_drop_the_worker() -> None:
    results = run_ranks(3, _slow_first_shard, timeout=60)
    assert results[0]["pulled"] and results[0]["versions"] == [0, 0]
    assert [r["dropped"] for r in results] == [[], [], []]


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
