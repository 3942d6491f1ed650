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
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scaledl.strategies.parameter_server import ErrorCode, Header, Kind, ProtocolError
from scaledl.strategies.parameter_server.protocol import (
    HEADER_TAG, PAYLOAD_TAG, REPLY_TAG, empty_header,
)
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


Request = tuple[Header, "torch.Tensor | None"]


def _send_bad_headers(strategy: ParameterServerStrategy, server: int,
                      requests: list[Request]) -> list[tuple[int, int]]:
    """Send raw requests (header and payload, as a link does) to ``server``; return each reply's
    (kind, aux)."""
    assert strategy.layout is not None and strategy.layout.ps_group is not None
    group, replies, pending = strategy.layout.ps_group, [], []
    for header, payload in requests:
        dist.send(header.with_payload(payload).encode(), server, group=group, tag=HEADER_TAG)
        if payload is not None:
            pending.append(dist.isend(payload, server, group=group, tag=PAYLOAD_TAG))
        raw = empty_header()
        dist.recv(raw, server, group=group, tag=REPLY_TAG)
        reply = Header.decode(raw)
        replies.append((reply.kind, reply.aux))
    strategy.__dict__.setdefault("_stray_sends", []).extend(pending)  # dropped: never received
    return replies


def _bad_headers(rank: int, shard: tuple[int, int, int], own: Kind,
                 foreign: Kind) -> list[Request]:
    """Unknown kind, forged sender, wrong shard size, another rule's request (with its payload),
    a PUSH from the future with a payload, a payload of the wrong dtype, a PULL with a payload:
    each is answered ERROR, its payload received and discarded, and the server serves on."""
    index, offset, numel = shard
    full = torch.full((numel,), 1000.0)
    return [
        (Header(77, rank, 0, numel, offset, 0, index), None),
        (Header(int(Kind.PULL), rank + 1, 0, numel, offset, 0, index), None),
        (Header(int(Kind.PULL), rank, 0, numel + 1, offset, 0, index), None),
        (Header(int(foreign), rank, 0, numel, offset, 0, index), full),
        (Header(int(Kind.PUSH), rank, 999, numel, offset, 0, index), full),
        (Header(int(own), rank, 0, numel, offset, 0, index), full.half()),
        (Header(int(Kind.PULL), rank, 0, numel, offset, 0, index), full[:3]),
    ]


def _fatal_request(rank: int, shard: tuple[int, int, int], own: Kind,
                   magic: bool) -> list[Request]:
    """A request the server cannot skip: a wrong magic, or a payload larger than the shard."""
    index, offset, numel = shard
    if magic:
        return [(Header(int(Kind.PULL), rank, 0, numel, offset, 0, index, magic=0xDEADBEEF),
                 None)]
    return [(Header(int(own), rank, 0, 4 * numel, offset, 0, index),
             torch.ones(4 * numel))]


def _broken_link(strategy: ParameterServerStrategy) -> list[str]:
    """A rejected PUSH through the link, then a PULL: both one-line ProtocolErrors."""
    errors = []
    for call in (lambda: strategy.link.push(torch.zeros_like(strategy.flat), [999, 999],
                                            torch.zeros_like(strategy.flat)),
                 lambda: strategy.link.pull(torch.zeros_like(strategy.flat))):
        try:
            call()
        except ProtocolError as exc:
            errors.append(str(exc))
    strategy.link.broken = None  # type: ignore[attr-defined]  # the servers served on: go on
    return errors


def _scenario(rank: int, name: str, servers: int, bad_from: int | None, bad_to: int,
              kill: int | None = None, fatal: dict[int, bool] | None = None,
              quiet: int | None = None, **options: Any) -> dict[str, Any]:
    start = time.perf_counter()
    records = _Records()
    logger = logging.getLogger("scaledl.strategies.parameter_server")
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    strategy = build(name, servers, data=DATA, **options)
    result: dict[str, Any] = {"worker": strategy.is_worker, "num_workers": strategy.num_workers}
    layout = strategy.layout
    assert layout is not None
    spec = layout.shards[layout.server_ranks.index(bad_to)]
    where = (spec.index, spec.offset, spec.numel)
    own, foreign = (Kind.EXCHANGE, Kind.PUSH) if strategy.rule == "easgd" else (Kind.PUSH,
                                                                                 Kind.EXCHANGE)
    if rank == bad_from:
        result["replies"] = _send_bad_headers(strategy, bad_to, _bad_headers(rank, where, own,
                                                                             foreign))
    if strategy.is_worker:
        def die() -> None:
            if rank == kill:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3.0)  # quiet for longer than timeout_s (tau steps, an evaluation, ...)
        stop = 5 if rank in (kill, quiet) else None
        train(strategy, EPOCHS, data_name=DATA, stop_after=stop, on_stop=die)
        result["accuracy"] = accuracy(strategy, collective=kill is None, data_name=DATA)
        result["pushes"] = strategy.stats.pushes
        if rank == 0:
            result["versions"] = strategy.state_dict()["strategy"]["server"]["versions"]
        if rank == bad_from and servers:
            result["link_errors"] = _broken_link(strategy)
        if fatal is not None and rank in fatal:
            result["fatal"] = _send_bad_headers(strategy, bad_to,
                                                _fatal_request(rank, where, own, fatal[rank]))
        else:
            strategy.finish()
    else:
        strategy.serve()
    strategy.close()
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
    keep("thread", _scenario(rank, "hogwild-easgd", 0, bad_from=3, bad_to=0,
                             fatal={2: True, 3: False}))
    dist.barrier()
    keep("killed", _scenario(rank, "async-measgd", 1, bad_from=None, bad_to=3, kill=KILLED,
                             quiet=1, timeout_s=2.0))
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


BAD = {rule: [[int(Kind.ERROR), int(code)] for code in (
    ErrorCode.BAD_KIND, ErrorCode.BAD_SENDER, ErrorCode.BAD_SHARD, ErrorCode.WRONG_RULE,
    ErrorCode.BAD_VERSION if rule == "sgd" else ErrorCode.WRONG_RULE,  # a PUSH from the future
    ErrorCode.BAD_PAYLOAD, ErrorCode.BAD_PAYLOAD)] for rule in ("sgd", "easgd")}


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
    for scenario, sender, server, rule in (("shards", 1, 2, "sgd"), ("thread", 3, 0, "easgd")):
        ranks = [runs[scenario][r] for r in range(WORLD)]
        assert ranks[sender]["replies"] == BAD[rule], scenario
        errors = [line for line in ranks[server]["log"]
                  if line.startswith("ERROR") and f"from rank {sender}" in line]
        # one more: shards, the PUSH through the link; thread, rank 3's oversized request
        assert len(errors) == len(BAD[rule]) + 1, (scenario, errors)
        assert ranks[sender]["accuracy"] >= 0.85  # and it trained normally afterwards
    # none of the rejected pushes (payload 1000.0 each) was applied: versions count real pushes
    assert runs["shards"][0]["versions"] == [runs["shards"][0]["pushes"]
                                             + runs["shards"][1]["pushes"]] * 2
    first, then = runs["shards"][1]["link_errors"]
    assert "rejected PUSH: BAD_VERSION" in first and "\n" not in first
    assert "link to the parameter servers is broken" in then and "\n" not in then


@pytest.mark.timeout(300)
def test_requests_that_cannot_be_skipped_drop_the_worker(runs: Runs) -> None:
    """A wrong magic and a payload larger than the shard: ERROR, then that worker is dropped
    (no receive is posted for it again, so the stray payload cannot abort the server)."""
    ranks = [runs["thread"][r] for r in range(WORLD)]
    assert ranks[2]["fatal"] == [[int(Kind.ERROR), int(ErrorCode.BAD_MAGIC)]]
    assert ranks[3]["fatal"] == [[int(Kind.ERROR), int(ErrorCode.BAD_SHARD)]]
    assert sorted(ranks[0]["dropped"]) == [2, 3]
    assert any("1 workers finished, 2 dropped" in line for line in ranks[0]["log"])


@pytest.mark.timeout(300)
def test_thread_fallback(runs: Runs) -> None:
    ranks = [runs["thread"][r] for r in range(WORLD)]
    assert all(r["worker"] and r["num_workers"] == WORLD for r in ranks)
    assert all(r["accuracy"] >= 0.85 for r in ranks)
    assert ranks[0]["versions"] == [sum(r["pushes"] for r in ranks)]
    assert ranks[0]["versions"] == [sum(r["pushes"] for r in ranks)]


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
    for rank in (0, 1):  # rank 1 was quiet for 3 s > timeout_s = 2 s and was kept
        assert runs["killed"][rank]["accuracy"] >= 0.85
