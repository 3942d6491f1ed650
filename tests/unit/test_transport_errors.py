"""A transport error names the peer and drops Gloo's source location and boilerplate, also when
the backend refuses the post itself (a peer whose process is gone), not only the wait."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from scaledl.transport.base import TransportError
from scaledl.backend_errors import first_line
from scaledl.transport.torch_p2p import TorchTransport

GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:5549. This is typically caused by a remote worker crashing. "
        "Check the logs of the remote worker before reporting an error. GLHF!")


def test_first_line_keeps_gloos_reason_only() -> None:
    assert first_line(RuntimeError(GLOO + "\nframe 0 ...")) == \
        "Connection closed by peer [127.0.0.1]:5549"
    assert first_line(RuntimeError("plain reason\nmore")) == "plain reason"
    assert first_line(RuntimeError("")) == "RuntimeError"


def test_a_refused_post_names_the_peers() -> None:
    def post(ops: Any) -> Any:
        raise RuntimeError(GLOO)

    channel = SimpleNamespace(rank=0, world_size=3, backend="gloo", timeout=5.0,
                              ordered_by_peer=False, global_ranks=(0, 4, 7), post=post)
    transport = TorchTransport(channel)  # type: ignore[arg-type]
    transport.queue_send(torch.ones(2), 1)
    transport.queue_recv(torch.ones(2), 2)
    with pytest.raises(TransportError) as error:
        transport.commit()
    assert str(error.value).startswith(
        "posting 2 transfers with ranks 4, 7 failed: Connection closed by peer "
        "[127.0.0.1]:5549; the peer may have died")
