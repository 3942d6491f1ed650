"""Errors of the Horovod API: failed collectives, calls that disagree across ranks, and the parts
of ``horovod.torch`` that :mod:`scaledl.horovod` does not provide."""

from __future__ import annotations

__all__ = ["HorovodInternalError", "MismatchError", "UnsupportedError", "unsupported"]


class HorovodInternalError(RuntimeError):
    """A collective failed: a peer died or timed out, or the ranks disagreed about the call.

    Horovod raises an error of this name from ``synchronize``; scripts that catch it keep
    working."""


class MismatchError(HorovodInternalError, ValueError):
    """The ranks called a collective with arguments that cannot match (shape, dtype, op, root,
    name or the collective itself).  Raised on every rank of the process set, before any data
    moves; it is also a ``ValueError``, since the caller's arguments are at fault."""


class UnsupportedError(NotImplementedError):
    """A part of ``horovod.torch`` that scaledl.horovod does not implement."""


def unsupported(feature: str, instead: str) -> UnsupportedError:
    """The error for ``feature``, with what to do ``instead``."""
    return UnsupportedError(f"{feature} is not supported by scaledl.horovod; {instead}")
