"""scaledl: scalable distributed deep-learning training on PyTorch.

The short public API: ``init`` (launcher bootstrap) returning a ``Topology``, and the in-place
collectives ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``, each with
a choice of algorithm (``scaledl.collectives.available("allreduce")``).

``import scaledl`` checks the installed torch's version and imports nothing heavy: each name
below loads its module (and torch) when first used.  So the ``scaledl`` command can catch a
Ctrl-C while torch is still loading and print one line instead of a traceback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# First: a one-sentence ImportError on a torch older than scaledl supports.
from scaledl.torch_version import check_installed_torch

if TYPE_CHECKING:
    from scaledl.bootstrap import init
    from scaledl.collectives import (
        CollectiveHandle, ReduceOp, allgather, allreduce, broadcast, explain, reduce,
        reduce_scatter,
    )
    from scaledl.strategies import AllreduceSGD, ReduceBroadcastSGD, Strategy, build_strategy
    from scaledl.sync.ddp_hook import ddp_hook
    from scaledl.sync import DataParallel, ReduceBroadcast
    from scaledl.topology import Topology

check_installed_torch()

__version__ = "0.1.0"

_HOMES = {
    "bootstrap": "scaledl", "init": "scaledl.bootstrap", "Topology": "scaledl.topology",
    **dict.fromkeys(("CollectiveHandle", "ReduceOp", "allgather", "allreduce", "broadcast",
                     "explain", "reduce", "reduce_scatter"), "scaledl.collectives"),
    **dict.fromkeys(("AllreduceSGD", "ReduceBroadcastSGD", "Strategy", "build_strategy"),
                    "scaledl.strategies"),
    **dict.fromkeys(("DataParallel", "ReduceBroadcast", "ddp_hook"), "scaledl.sync"),
}
"""Where each public name lives (``scaledl`` itself: a submodule of that name)."""


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'scaledl' has no attribute {name!r}")
    module = importlib.import_module(f"scaledl.{name}" if home == "scaledl" else home)
    value = module if home == "scaledl" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def shutdown() -> None:
    """Stop scaledl's communicator threads, then destroy the default process group."""
    from scaledl import bootstrap
    from scaledl.collectives.communicator import forget_communicators

    forget_communicators()
    bootstrap.shutdown()


__all__ = [
    "init", "shutdown", "Topology", "allreduce", "reduce_scatter", "allgather", "broadcast",
    "reduce", "explain",
    "CollectiveHandle", "ReduceOp", "DataParallel", "ReduceBroadcast", "ddp_hook", "Strategy",
    "AllreduceSGD", "ReduceBroadcastSGD", "build_strategy", "__version__",
]
