"""The parameter server survives headers and payloads of the wrong size, shape or version.

Four real ranks: a :class:`ShardServer` on rank 0 and three workers that send raw messages.
Gloo aborts a process that receives a message larger than its buffer and fills a larger buffer
only in part, so before the self-framing header a longer header killed the server and a shorter
one was served.  Now every such request is answered ERROR and never applied; a request whose
framing can be followed (an honestly longer header, another version, a payload of the wrong
size) leaves its worker served, one whose size is not what it declares drops its worker; the
well-behaved worker is served throughout, and the server ends with exactly the valid updates.

Two scenarios run one after the other, each on a process group of its own (so the stray
messages of dropped workers of the first cannot reach the second).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from scaledl.strategies.parameter_server import (
    MAGIC, ErrorCode, Header, Kind, RemoteServers, ServerShard, ShardServer, ShardSpec,
)
from scaledl.strategies.parameter_server.protocol import (
    HEADER_TAG, PAYLOAD_TAG, REPLY_TAG, empty_header,
)
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

WORLD, NUMEL = 4, 5
SPEC = ShardSpec(0, 0, NUMEL)
BAD = 1000.0
"""Every malformed payload is full of this: applied even once, it would show in the params."""


def _header(kind: Kind, rank: int, payload: torch.Tensor | None = None) -> torch.Tensor:
    return Header(int(kind), rank, 0, NUMEL, 0, 0, 0).with_payload(payload).encode()


def _send(group: Any, values: torch.Tensor, payload: torch.Tensor | None = None) -> list[int]:
    """Send a raw header (and payload); return the reply's [kind, aux]."""
    dist.send(values, 0, group=group, tag=HEADER_TAG)
    if payload is not None:
        dist.send(payload, 0, group=group, tag=PAYLOAD_TAG)
    reply = empty_header()
    dist.recv(reply, 0, group=group, tag=REPLY_TAG)
    decoded = Header.decode(reply)
    return [decoded.kind, decoded.aux]


def _recoverable(rank: int, group: Any) -> list[list[int]]:
    """Requests whose framing can be followed: each is rejected, the worker stays served."""
    good = torch.full((NUMEL,), BAD)
    header = _header(Kind.PUSH, rank, good)
    longer = torch.cat([header, torch.tensor([7, 7])])
    longer[1] = longer.numel()  # an honestly declared header of 13 values
    future = header.clone()
    future[0] = (MAGIC & ~0xFFFF) | 4  # protocol version 4
    return [
        _send(group, longer, good),
        _send(group, future, good),
        _send(group, header, torch.full((NUMEL - 2,), BAD)),  # shorter payload than announced
        _send(group, header, torch.full((NUMEL + 2,), BAD)),  # longer payload than announced
    ]


def _link(rank: int, group: Any) -> RemoteServers:
    return RemoteServers(rank, [(0, SPEC)], group, timeout_s=20.0, worker=rank - 1,
                      num_workers=WORLD - 1, dtype=torch.float32)


def _good_worker(rank: int, group: Any, updates: list[float]) -> list[int]:
    link = _link(rank, group)
    versions = [0]
    for value in updates:
        versions = link.push(torch.full((NUMEL,), value), versions, torch.empty(NUMEL)).versions
    link.done()
    return versions


def _server(group: Any) -> dict[str, Any]:
    shard = ServerShard(SPEC, torch.zeros(NUMEL), "sgd")
    server = ShardServer(shard, 0, [1, 2, 3], group, timeout_s=20.0)
    assert server.join(60.0), "serving threads still running"
    return {"params": shard.params.tolist(), "version": shard.version,
            "dropped": sorted(server.dropped), "finished": sorted(server.finished),
            "rejected": server.rejected}


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    first, second = dist.new_group(list(range(world_size))), dist.new_group(list(range(world_size)))
    result: dict[str, Any] = {}
    # A: rank 1's framing can be followed, rank 2 sends a shorter header, rank 3 behaves
    if rank == 0:
        result["A"] = _server(first)
    elif rank == 1:
        result["A"] = _recoverable(rank, first) + [_good_worker(rank, first, [1.0])]
    elif rank == 2:
        result["A"] = _send(first, _header(Kind.DONE, rank)[:-1])  # 10 of its 11 values
    else:
        result["A"] = _good_worker(rank, first, [0.25, 0.25])
    # B: rank 1 sends more values than its header declares, rank 2 an old-version header
    if rank == 0:
        result["B"] = _server(second)
    elif rank == 1:
        result["B"] = _send(second, torch.cat([_header(Kind.DONE, rank), torch.zeros(2).long()]))
    elif rank == 2:
        old = torch.tensor([(MAGIC & ~0xFFFF) | 2, int(Kind.DONE), rank, 0, NUMEL, 0, 0, 0, 0, 0])
        result["B"] = _send(second, old)
    else:
        result["B"] = _good_worker(rank, second, [0.5])
    return result


@pytest.mark.timeout(180)
def test_malformed_requests_are_rejected_and_the_server_serves_on() -> None:
    ranks = run_ranks(WORLD, _scenarios, timeout=150)
    error = int(Kind.ERROR)
    # A
    server = ranks[0]["A"]
    assert ranks[1]["A"][:4] == [[error, int(ErrorCode.BAD_HEADER)],
                                 [error, int(ErrorCode.BAD_PROTOCOL)],
                                 [error, int(ErrorCode.BAD_PAYLOAD)],
                                 [error, int(ErrorCode.BAD_PAYLOAD)]]
    assert ranks[2]["A"] == [error, int(ErrorCode.BAD_FRAME)]
    assert server["dropped"] == [2] and server["finished"] == [1, 3]
    assert server["rejected"] == 5
    assert server["version"] == 3  # rank 1's one valid push and rank 3's two
    assert server["params"] == [-1.5] * NUMEL  # -(1.0 + 0.25 + 0.25): no BAD value applied
    # B
    server = ranks[0]["B"]
    assert ranks[1]["B"] == [error, int(ErrorCode.BAD_FRAME)]
    assert ranks[2]["B"] == [error, int(ErrorCode.BAD_PROTOCOL)]
    assert server["dropped"] == [1, 2] and server["finished"] == [3]
    assert server["version"] == 1 and server["params"] == [-0.5] * NUMEL
