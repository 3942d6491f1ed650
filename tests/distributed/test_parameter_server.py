"""The parameter server on real processes: shards, thread fallback, bad headers, a killed worker.

One set of 4 ranks runs three scenarios in turn (process start-up dominates the cost):

A. two dedicated server ranks, each owning half of the flat parameters, two workers; before
   training, worker 1 sends malformed headers to server rank 2, which must answer ERROR, log it
   and keep serving;
B. the server thread beside rank 0 (four workers), with a malformed header sent to the thread;
C. one dedicated server, three workers; worker rank 2 SIGKILLs itself mid-training: the server
   logs and drops it, the other workers finish, and the server returns from ``serve()``.

The results are gathered once (a module fixture) and checked by separate tests.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from scaledl.strategies.parameter_server import ErrorCode, Header, Kind
from scaledl.strategies.parameter_server.protocol import HEADER_TAG, REPLY_TAG, empty_header
from scaledl.strategies.parameter_server.strategy import ParameterServerStrategy
from tests.distributed.test_async_strategies import accuracy, build, train
from tests.harness import _worker, free_port

pytestmark = pytest.mark.distributed

WORLD, KILLED, DATA, EPOCHS = 4, 2, "synthetic:32:4", 6


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _send_bad_headers(strategy: ParameterServerStrategy, server: int,
                      headers: list[Header]) -> list[tuple[int, int]]:
    """Send raw headers to ``server``; return each reply's (kind, aux)."""
    assert strategy.layout is not None and strategy.layout.ps_group is not None
    group, replies = strategy.layout.ps_group, []
    for header in headers:
        dist.send(header.encode(), server, group=group, tag=HEADER_TAG)
        raw = empty_header()
        dist.recv(raw, server, group=group, tag=REPLY_TAG)
        reply = Header.decode(raw)
        replies.append((reply.kind, reply.aux))
    return replies


def _bad_headers(rank: int, shard: tuple[int, int, int], foreign: Kind) -> list[Header]:
    """Bad magic, unknown kind, forged sender, wrong shard size, another rule's request."""
    index, offset, numel = shard
    return [
        Header(int(Kind.PUSH), rank, 0, numel, offset, 0, index, magic=0xDEADBEEF),
        Header(77, rank, 0, numel, offset, 0, index),
        Header(int(Kind.PULL), rank + 1, 0, numel, offset, 0, index),
        Header(int(Kind.PULL), rank, 0, numel + 1, offset, 0, index),
        Header(int(foreign), rank, 0, numel, offset, 0, index),
    ]


def _scenario(rank: int, name: str, servers: int, bad_from: int | None, bad_to: int,
              kill: int | None = None) -> dict[str, Any]:
    start = time.perf_counter()
    records = _Records()
    logger = logging.getLogger("scaledl.strategies.parameter_server")
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    strategy = build(name, servers, data=DATA)
    result: dict[str, Any] = {"worker": strategy.is_worker, "num_workers": strategy.num_workers}
    layout = strategy.layout
    assert layout is not None
    if rank == bad_from:
        spec = layout.shards[layout.server_ranks.index(bad_to)]
        foreign = Kind.PUSH if strategy.rule == "easgd" else Kind.EXCHANGE
        result["replies"] = _send_bad_headers(strategy, bad_to, _bad_headers(rank, (
            spec.index, spec.offset, spec.numel), foreign))
    if strategy.is_worker:
        def die() -> None:
            os.kill(os.getpid(), signal.SIGKILL)
        train(strategy, EPOCHS, data_name=DATA, stop_after=5 if rank == kill else None, on_stop=die)
        result["accuracy"] = accuracy(strategy, collective=kill is None, data_name=DATA)
        result["pushes"] = strategy.stats.pushes
        if rank == 0:
            result["versions"] = strategy.state_dict()["strategy"]["server"]["versions"]
        strategy.finish()
    else:
        strategy.serve()
    result["dropped"] = strategy.dropped_workers
    result["log"] = records.lines
    result["seconds"] = time.perf_counter() - start
    logger.removeHandler(records)
    return result


def _scenarios(rank: int, world_size: int, directory: str) -> int:
    """Run A, B, C; each rank writes each result to a file (the killed rank cannot return)."""
    def keep(name: str, result: dict[str, Any]) -> None:
        (Path(directory) / f"{name}-{rank}.json").write_text(json.dumps(result))

    keep("shards", _scenario(rank, "async-sgd", 2, bad_from=1, bad_to=2))
    dist.barrier()
    keep("thread", _scenario(rank, "hogwild-easgd", 0, bad_from=3, bad_to=0))
    dist.barrier()
    keep("killed", _scenario(rank, "async-measgd", 1, bad_from=None, bad_to=3, kill=KILLED))
    return rank


def run_allowing_deaths(world_size: int, fn: Any, *args: Any, dead: set[int],
                        timeout: float) -> tuple[dict[int, Any], list[int | None]]:
    """Like ``tests.harness.run_ranks``, but ranks in ``dead`` may die without reporting: return
    the other ranks' values and every rank's exit code."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, results, {}),
                         daemon=True) for r in range(world_size)]
    for proc in procs:
        proc.start()
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size - len(dead) and time.monotonic() < deadline:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                lost = [r for r, p in enumerate(procs)
                        if r not in dead and r not in values and p.exitcode is not None]
                assert not lost, f"ranks {lost} died before reporting"
                continue
            assert ok, f"rank {rank} failed:\n{value}"
            values[rank] = value
    finally:
        stop = time.monotonic() + 5.0  # one grace period for all (interpreter exit is slow)
        for proc in procs:
            proc.join(timeout=max(0.1, stop - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
    assert len(values) == world_size - len(dead), f"only ranks {sorted(values)} finished in time"
    return values, [proc.exitcode for proc in procs]


Runs = dict[str, Any]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Every scenario's result per rank, the ranks that returned, and the exit codes."""
    directory = tmp_path_factory.mktemp("ps")
    values, exitcodes = run_allowing_deaths(WORLD, _scenarios, str(directory), dead={KILLED},
                                            timeout=240)
    out: Runs = {"returned": sorted(values), "exitcodes": exitcodes}
    for name in ("shards", "thread", "killed"):
        out[name] = {int(p.stem.split("-")[1]): json.loads(p.read_text())
                     for p in directory.glob(f"{name}-*.json")}
    return out


BAD = [[int(Kind.ERROR), int(code)] for code in (
    ErrorCode.BAD_MAGIC, ErrorCode.BAD_KIND, ErrorCode.BAD_SENDER, ErrorCode.BAD_SHARD,
    ErrorCode.WRONG_RULE)]


@pytest.mark.timeout(300)
def test_sharded_dedicated_servers(runs: Runs) -> None:
    ranks = [runs["shards"][r] for r in range(WORLD)]
    assert [r["worker"] for r in ranks] == [True, True, False, False]
    assert all(r["num_workers"] == 2 for r in ranks)
    pushes = sum(r["pushes"] for r in ranks[:2])
    assert ranks[0]["versions"] == [pushes, pushes]  # every push reached both shards
    for worker in ranks[:2]:
        assert worker["accuracy"] >= 0.85, worker
    assert all(r["dropped"] == [] for r in ranks)


@pytest.mark.timeout(300)
def test_malformed_headers_rejected_and_server_serves_on(runs: Runs) -> None:
    for scenario, sender, server in (("shards", 1, 2), ("thread", 3, 0)):
        ranks = [runs[scenario][r] for r in range(WORLD)]
        assert ranks[sender]["replies"] == BAD, scenario
        errors = [line for line in ranks[server]["log"] if line.startswith("ERROR")]
        assert len(errors) == len(BAD), (scenario, errors)
        assert all(f"from rank {sender}" in line for line in errors)
        assert ranks[sender]["accuracy"] >= 0.85  # and it trained normally afterwards


@pytest.mark.timeout(300)
def test_thread_fallback(runs: Runs) -> None:
    ranks = [runs["thread"][r] for r in range(WORLD)]
    assert all(r["worker"] and r["num_workers"] == WORLD for r in ranks)
    assert all(r["accuracy"] >= 0.85 for r in ranks)
    assert ranks[0]["versions"] == [sum(r["pushes"] for r in ranks)]
    assert any("3 workers finished, 0 dropped" in line for line in ranks[0]["log"])


@pytest.mark.timeout(300)
def test_killed_worker_is_dropped_and_others_finish(runs: Runs) -> None:
    assert runs["exitcodes"][KILLED] == -signal.SIGKILL
    assert runs["returned"] == [r for r in range(WORLD) if r != KILLED]
    assert sorted(runs["killed"]) == [r for r in range(WORLD) if r != KILLED]
    server = runs["killed"][3]
    assert server["dropped"] == [KILLED]
    warnings = [line for line in server["log"] if line.startswith("WARNING")]
    assert len(warnings) == 1 and f"dropping worker rank {KILLED}" in warnings[0]
    assert any("2 workers finished, 1 dropped" in line for line in server["log"])
    for rank in (0, 1):
        assert runs["killed"][rank]["accuracy"] >= 0.85
