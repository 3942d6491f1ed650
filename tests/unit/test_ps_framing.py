"""Parameter-server framing: the preamble is judged before any other field."""

from __future__ import annotations

import pytest
import torch

from scaledl.strategies.parameter_server import HEADER_LEN, MAGIC, ErrorCode, Header, Kind
from scaledl.strategies.parameter_server.protocol import ProtocolError
from scaledl.strategies.parameter_server.framing import read_frame, untrusted_magic

FAMILY = MAGIC & ~0xFFFF


def _push() -> torch.Tensor:
    return Header(int(Kind.PUSH), 1, 0, 5, 0, 0, 0).with_payload(torch.zeros(5)).encode()


def test_header_starts_with_its_preamble() -> None:
    raw = _push()
    assert raw.tolist()[:3] == [MAGIC, HEADER_LEN, 20]
    frame = read_frame(raw)
    assert frame.problem is None and frame.trusted and frame.payload_bytes == 20
    assert frame.header == Header.decode(raw) and frame.require("rank 1") == frame.header


@pytest.mark.parametrize(("magic", "code"), [
    (0xBAD, ErrorCode.BAD_MAGIC), (FAMILY | 2, ErrorCode.BAD_PROTOCOL),
])
def test_untrusted_magic(magic: int, code: ErrorCode) -> None:
    frame = untrusted_magic(magic)
    assert frame is not None and frame.problem is not None and frame.problem[0] == code
    assert not frame.trusted
    with pytest.raises(ProtocolError, match="rank 7 sent a message that is not") as caught:
        frame.require("rank 7")
    assert "\n" not in str(caught.value)
    assert untrusted_magic(MAGIC) is None and untrusted_magic(FAMILY | 9) is None


def test_other_version_and_longer_header_keep_their_framing() -> None:
    future = _push()
    future[0] = FAMILY | 4
    frame = read_frame(future)
    assert frame.problem is not None and frame.problem[0] == ErrorCode.BAD_PROTOCOL
    assert frame.trusted and frame.payload_bytes == 20 and frame.header is None
    longer = torch.cat([_push(), torch.tensor([1, 2])])
    longer[1] = longer.numel()
    frame = read_frame(longer)
    assert frame.problem is not None and frame.problem[0] == ErrorCode.BAD_HEADER
    assert frame.trusted and frame.payload_bytes == 20


def test_decode_refuses_a_header_that_declares_another_length() -> None:
    raw = _push()
    raw[1] = HEADER_LEN + 1
    with pytest.raises(ProtocolError, match="declares 12 values"):
        Header.decode(raw)
