"""Transports: point-to-point messaging under the collectives (torch.distributed, loopback)."""

from scaledl.transport.base import Handle, Transport, TransportError
from scaledl.transport.loopback import LoopbackFabric, LoopbackTransport, run_threads
from scaledl.transport.torch_p2p import TorchTransport

__all__ = [
    "Handle", "Transport", "TransportError", "TorchTransport",
    "LoopbackFabric", "LoopbackTransport", "run_threads",
]
