"""Parameter-server protocol: header encoding, request/reply checks, shards, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from scaledl.strategies.async_easgd import AsyncEASGD, AsyncMEASGD
from scaledl.strategies.async_sgd import AsyncMSGD, AsyncSGD
from scaledl.strategies.parameter_server import (
    HEADER_LEN, MAGIC, ErrorCode, Header, Kind, ProtocolError, ShardSpec, check_servers,
    shard_specs,
)
from scaledl.strategies.parameter_server.protocol import check_reply, check_request

SPEC = ShardSpec(index=1, offset=10, numel=5)
SERVES = frozenset({Kind.PUSH, Kind.PULL, Kind.STATE, Kind.DONE})
INT64 = st.integers(-(2**63), 2**63 - 1)


@given(INT64, INT64, INT64, INT64, INT64, INT64, INT64)
def test_header_round_trip(kind: int, sender: int, version: int, numel: int, offset: int,
                           aux: int, shard: int) -> None:
    header = Header(kind, sender, version, numel, offset, aux, shard)
    raw = header.encode()
    assert raw.dtype == torch.int64 and raw.shape == (HEADER_LEN,)
    assert Header.decode(raw) == header


def test_decode_rejects_wrong_size_or_dtype() -> None:
    with pytest.raises(ProtocolError, match="8 int64"):
        Header.decode(torch.zeros(7, dtype=torch.int64))
    with pytest.raises(ProtocolError, match="int64"):
        Header.decode(torch.zeros(HEADER_LEN, dtype=torch.float32))


def _request(**changes: int) -> Header:
    fields = dict(kind=int(Kind.PUSH), sender=3, version=2, numel=5, offset=10, aux=0, shard=1,
                  magic=MAGIC)
    fields.update(changes)
    return Header(**fields)


def test_valid_request_passes() -> None:
    assert check_request(_request(), 3, SPEC, version=4, allowed=SERVES) is None
    assert check_request(_request(kind=int(Kind.DONE), version=0), 3, SPEC, 0, SERVES) is None


@pytest.mark.parametrize("changes, source, code", [
    ({"magic": 0xBAD}, 3, ErrorCode.BAD_MAGIC),
    ({"kind": 42}, 3, ErrorCode.BAD_KIND),
    ({"kind": int(Kind.PUSH_REPLY)}, 3, ErrorCode.BAD_KIND),
    ({"kind": int(Kind.EXCHANGE)}, 3, ErrorCode.WRONG_RULE),
    ({}, 2, ErrorCode.BAD_SENDER),
    ({"numel": 6}, 3, ErrorCode.BAD_SHARD),
    ({"offset": 0}, 3, ErrorCode.BAD_SHARD),
    ({"shard": 0}, 3, ErrorCode.BAD_SHARD),
    ({"version": 5}, 3, ErrorCode.BAD_VERSION),
    ({"version": -1}, 3, ErrorCode.BAD_VERSION),
])
def test_bad_requests_are_named(changes: dict[str, int], source: int, code: ErrorCode) -> None:
    problem = check_request(_request(**changes), source, SPEC, version=4, allowed=SERVES)
    assert problem is not None and problem[0] == code and problem[1]


def test_check_reply() -> None:
    good = Header(int(Kind.PUSH_REPLY), 7, 3, 5, 10, 1, 1)
    check_reply(good, Kind.PUSH, 7, SPEC)
    with pytest.raises(ProtocolError, match="rejected PUSH: BAD_SHARD"):
        check_reply(Header(int(Kind.ERROR), 7, aux=int(ErrorCode.BAD_SHARD)), Kind.PUSH, 7, SPEC)
    with pytest.raises(ProtocolError, match="expected PULL_REPLY"):
        check_reply(good, Kind.PULL, 7, SPEC)
    with pytest.raises(ProtocolError, match="expected PUSH_REPLY from rank 6"):
        check_reply(good, Kind.PUSH, 6, SPEC)
    with pytest.raises(ProtocolError, match="bad magic"):
        check_reply(Header(int(Kind.PUSH_REPLY), 7, magic=1), Kind.PUSH, 7, SPEC)


def test_payload_sizes() -> None:
    assert _request().payload_numel() == 5
    assert _request(kind=int(Kind.PULL)).payload_numel() == 0
    assert Header(int(Kind.STATE_REPLY), 0, numel=5, aux=1).payload_numel() == 10
    assert Header(int(Kind.STATE_REPLY), 0, numel=5, aux=0).payload_numel() == 5
    assert Header(int(Kind.ERROR), 0, numel=5).payload_numel() == 0


@pytest.mark.parametrize("numel, servers", [(10, 1), (10, 3), (7, 7), (1000, 4)])
def test_shards_cover_the_vector(numel: int, servers: int) -> None:
    specs = shard_specs(numel, servers)
    assert [s.index for s in specs] == list(range(servers))
    assert specs[0].offset == 0 and sum(s.numel for s in specs) == numel
    for left, right in zip(specs, specs[1:]):
        assert left.offset + left.numel == right.offset
    assert max(s.numel for s in specs) - min(s.numel for s in specs) <= 1


def test_shards_bad_counts() -> None:
    with pytest.raises(ValueError, match="servers 4 cannot shard 3 parameters"):
        shard_specs(3, 4)


def test_servers_checks() -> None:
    assert check_servers(2, 3) == 2
    with pytest.raises(ValueError, match="servers 3 leaves no worker among 3 ranks"):
        check_servers(3, 3)
    with pytest.raises(ValueError, match="servers 1 needs a spare rank"):
        check_servers(1, 1)
    with pytest.raises(ValueError, match="servers -1 must be an integer >= 0"):
        check_servers(-1, 4)


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("cls, options, message", [
    (AsyncEASGD, {"alpha": 1.0}, "alpha 1.0 must be in"),
    (AsyncEASGD, {"alpha": 0.0}, "alpha 0.0 must be in"),
    (AsyncMEASGD, {"tau": 0}, "tau 0 must be an integer >= 1"),
    (AsyncMSGD, {"momentum": 1.0}, "momentum 1.0 must be in"),
    (AsyncMEASGD, {"momentum": -0.1}, "momentum -0.1 must be in"),
    (AsyncSGD, {"servers": 1}, "servers 1 needs a spare rank"),
    (AsyncSGD, {"servers": -2}, "servers -2 must be"),
    (AsyncSGD, {"timeout_s": 0}, "timeout_s 0 must be positive"),
])
def test_bad_options_one_line(cls: type, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        cls(*_model(), **options)
    assert "\n" not in str(info.value)
