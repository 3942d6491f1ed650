"""The parts of ``horovod.torch`` scaledl.horovod does not implement, each raising an
:class:`~scaledl.horovod.errors.UnsupportedError` that names it, instead of an
``AttributeError`` far from the cause."""

from __future__ import annotations

import types
from typing import Any, NoReturn

from scaledl.horovod.errors import unsupported

__all__ = ["elastic", "start_timeline", "stop_timeline"]


class _Elastic(types.ModuleType):
    """``hvd.elastic``: every attribute raises."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise unsupported(f"hvd.elastic.{name} (elastic training)",
                          "run a fixed set of ranks and resume from a checkpoint after a failure")


elastic = _Elastic("scaledl.horovod.elastic", "Not supported: see docs/horovod.md.")


def start_timeline(*args: Any, **kwargs: Any) -> NoReturn:
    """Not supported."""
    raise unsupported("hvd.start_timeline", "use scaledl.train's timeline (timeline.json of "
                      "scaledl train) or torch.profiler")


def stop_timeline(*args: Any, **kwargs: Any) -> NoReturn:
    """Not supported."""
    raise unsupported("hvd.stop_timeline", "use torch.profiler")
