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
    HEADER_LEN, MAGIC, ErrorCode, Header, Kind, ProtocolError, ServerShard, ShardServer,
    ShardSpec, check_servers, shard_specs,
)
from scaledl.strategies.parameter_server import server as server_module
from scaledl.strategies.parameter_server.protocol import (
    DTYPE_CODES, check_reply, check_request, expected_payload,
)
from scaledl.transport.direct import DirectTransport, PeerError

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
    with pytest.raises(ProtocolError, match=f"{HEADER_LEN} int64"):
        Header.decode(torch.zeros(7, dtype=torch.int64))
    with pytest.raises(ProtocolError, match="int64"):
        Header.decode(torch.zeros(HEADER_LEN, dtype=torch.float32))


F32 = torch.float32


def _request(**changes: int) -> Header:
    fields = dict(kind=int(Kind.PUSH), sender=3, version=2, numel=5, offset=10, aux=0, shard=1,
                  payload_bytes=20, dtype=DTYPE_CODES[F32], magic=MAGIC)
    fields.update(changes)
    return Header(**fields)


def test_valid_request_passes() -> None:
    assert check_request(_request(), 3, SPEC, version=4, allowed=SERVES, dtype=F32) is None
    done = _request(kind=int(Kind.DONE), version=0, payload_bytes=0, dtype=0)
    assert check_request(done, 3, SPEC, 0, SERVES, F32) is None


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
    ({"payload_bytes": 40}, 3, ErrorCode.BAD_PAYLOAD),
    ({"payload_bytes": 0, "dtype": 0}, 3, ErrorCode.BAD_PAYLOAD),
    ({"dtype": DTYPE_CODES[torch.float64]}, 3, ErrorCode.BAD_PAYLOAD),
    ({"kind": int(Kind.PULL)}, 3, ErrorCode.BAD_PAYLOAD),  # PULL carries no payload
])
def test_bad_requests_are_named(changes: dict[str, int], source: int, code: ErrorCode) -> None:
    problem = check_request(_request(**changes), source, SPEC, version=4, allowed=SERVES,
                            dtype=F32)
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
    assert expected_payload(Kind.PUSH, 5, F32) == (20, DTYPE_CODES[F32])
    assert expected_payload(Kind.PULL, 5, F32) == (0, 0)
    assert expected_payload(Kind.STATE_REPLY, 5, torch.float64, momentum=True) == (80, 2)
    assert expected_payload(Kind.STATE_REPLY, 5, torch.float64) == (40, 2)
    assert expected_payload(Kind.ERROR, 5, F32) == (0, 0)
    header = Header(int(Kind.PUSH), 0).with_payload(torch.zeros(3, dtype=torch.float16))
    assert (header.payload_bytes, header.dtype) == (6, DTYPE_CODES[torch.float16])
    assert Header.decode(header.encode()) == header


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
    (AsyncSGD, {"idle_timeout_s": -1.0}, "timeout_s -1.0 must be positive"),
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


@pytest.mark.parametrize("cls, keyword", [
    (AsyncSGD, {"taus": 4}), (AsyncSGD, {"momentum": 0.5}), (AsyncMSGD, {"alpha": 0.1}),
    (AsyncEASGD, {"momentum": 0.5}), (AsyncEASGD, {"algorithm": "ring"}),
    (AsyncMEASGD, {"taus": 4}),
])
def test_unknown_keywords_are_errors(cls: type, keyword: dict[str, object]) -> None:
    with pytest.raises(TypeError, match=next(iter(keyword))):
        cls(*_model(), **keyword)


def _optimizer(kind: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(3, 2)
    if kind == "adam":
        return model, torch.optim.Adam(model.parameters(), lr=0.1)
    if kind == "groups":
        return model, torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias],
                                                                    "lr": 0.5}], lr=0.1)
    if kind == "nesterov":
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5)


@pytest.mark.parametrize("cls, kind, message", [
    (AsyncSGD, "adam", "not Adam"), (AsyncEASGD, "adam", "not Adam"),
    (AsyncMSGD, "groups", "2 parameter groups"), (AsyncMEASGD, "groups", "2 parameter groups"),
    (AsyncMSGD, "nesterov", "cannot apply Nesterov"), (AsyncSGD, "nesterov", "Nesterov"),
    (AsyncMSGD, "dampening", "dampening=0.5"), (AsyncMEASGD, "dampening", "dampening=0.5"),
])
def test_optimizers_the_server_cannot_honour(cls: type, kind: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        cls(*_optimizer(kind))
    assert "\n" not in str(info.value)


def test_equal_groups_and_nesterov_for_measgd_are_fine() -> None:
    model = nn.Linear(3, 2)
    groups = [{"params": [model.weight]}, {"params": [model.bias]}]
    assert AsyncSGD(model, torch.optim.SGD(groups, lr=0.1)).lr == 0.1
    nesterov = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8, nesterov=True)
    assert AsyncMEASGD(model, nesterov).momentum == 0.8


def test_posting_errors_are_one_line_peer_errors() -> None:
    """dist.isend/irecv raise synchronously without a process group: a one-line PeerError."""
    with pytest.raises(PeerError, match="send to rank 3 failed: ") as info:
        DirectTransport(None).isend(torch.zeros(2), 3, 71)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    with pytest.raises(PeerError, match="receive from rank 2 failed: "):
        DirectTransport(None).recv(torch.zeros(2), 2, 71, 1.0)  # type: ignore[arg-type]


def test_unexpected_error_in_a_serving_thread_drops_that_worker(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr(server_module, "recv_header", broken)
    shard = ServerShard(SPEC, torch.zeros(5), "sgd")
    server = ShardServer(shard, 0, [1, 2], None, 1.0)  # type: ignore[arg-type]
    assert server.join(10.0)
    assert sorted(server.dropped) == [1, 2] and server.finished == []
    assert "unexpected TypeError: a bug" in caplog.text
