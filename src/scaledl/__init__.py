"""scaledl: scalable distributed deep-learning training on PyTorch.

The short public API: ``init`` (launcher bootstrap) returning a ``Topology``, and the in-place
collectives ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``, each with
a choice of algorithm (``scaledl.collectives.available("allreduce")``).
"""

# First: raises a one-sentence ImportError on a torch older than scaledl supports.
from scaledl import torch_version as _torch_version  # noqa: F401
from scaledl import bootstrap
from scaledl.bootstrap import init
from scaledl.collectives import (
    CollectiveHandle, ReduceOp, allgather, allreduce, broadcast, explain, reduce, reduce_scatter,
)
from scaledl.strategies import AllreduceSGD, ReduceBroadcastSGD, Strategy, build_strategy
from scaledl.sync import DataParallel, ReduceBroadcast, ddp_hook
from scaledl.topology import Topology

__version__ = "0.1.0"


def shutdown() -> None:
    """Stop scaledl's communicator threads, then destroy the default process group."""
    from scaledl.collectives.communicator import forget_communicators

    forget_communicators()
    bootstrap.shutdown()

__all__ = [
    "init", "shutdown", "Topology", "allreduce", "reduce_scatter", "allgather", "broadcast",
    "reduce", "explain",
    "CollectiveHandle", "ReduceOp", "DataParallel", "ReduceBroadcast", "ddp_hook", "Strategy",
    "AllreduceSGD", "ReduceBroadcastSGD", "build_strategy", "__version__",
]
