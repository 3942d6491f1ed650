"""scaledl: scalable distributed deep-learning training on PyTorch.

The short public API: ``init`` (launcher bootstrap) returning a ``Topology``, and the in-place
collectives ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``, each with
a choice of algorithm (``scaledl.collectives.available("allreduce")``).

``import scaledl`` checks the installed torch's version and imports nothing heavy: each name
below, and each submodule (``scaledl.collectives``, ``scaledl.data``, ...), loads its module
(and torch) when first used.  So the ``scaledl`` command can catch a Ctrl-C while torch is still
loading and print one line instead of a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
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
    from scaledl.train.model_file import load_model

check_installed_torch()

__version__ = "0.1.0"

_HOMES = {
    "init": "scaledl.bootstrap", "Topology": "scaledl.topology",
    **dict.fromkeys(("CollectiveHandle", "ReduceOp", "allgather", "allreduce", "broadcast",
                     "explain", "reduce", "reduce_scatter"), "scaledl.collectives"),
    **dict.fromkeys(("AllreduceSGD", "ReduceBroadcastSGD", "Strategy", "build_strategy"),
                    "scaledl.strategies"),
    **dict.fromkeys(("DataParallel", "ReduceBroadcast", "ddp_hook"), "scaledl.sync"),
    "load_model": "scaledl.train.model_file",
}
"""Where each public name lives."""


def __getattr__(name: str) -> Any:
    """Load a public name's module, or a submodule, on first use (PEP 562): after ``import
    scaledl``, ``scaledl.collectives.available()`` works as ``scaledl.init()`` does."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'scaledl' has no attribute {name!r}")
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
    "AllreduceSGD", "ReduceBroadcastSGD", "build_strategy", "load_model", "__version__",
]
