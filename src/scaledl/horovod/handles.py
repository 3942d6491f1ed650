"""Handles of asynchronous calls: ``hvd.poll(handle)`` and ``hvd.synchronize(handle)``.

An ``*_async`` call returns a :class:`Handle` over the scaledl collective(s) it started (each a
job of its group's communicator, run in call order) and a *finish* step that turns the working
buffers into the result: scaling, copying back, trimming padding.  ``poll`` says whether the
collectives are done (``synchronize`` then does not block on communication); ``synchronize``
waits, finishes once and returns the result, raising
:class:`~scaledl.horovod.errors.HorovodInternalError` if a collective failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from scaledl.collectives import CollectiveHandle
from scaledl.horovod.errors import HorovodInternalError

__all__ = ["Handle", "poll", "synchronize", "done"]

T = TypeVar("T")


class Handle(Generic[T]):
    """An asynchronous Horovod call in flight."""

    def __init__(
        self, works: Sequence[CollectiveHandle | None], finish: Callable[[], T], what: str
    ) -> None:
        self._works = [work for work in works if work is not None]
        self._finish: Callable[[], T] | None = finish
        self._what = what
        self._result: T | None = None

    def poll(self) -> bool:
        """True once every collective of the call has finished."""
        return all(work.is_completed() for work in self._works)

    def wait(self) -> T:
        """Wait for the collectives, finish the result once, return it."""
        if self._finish is not None:
            for work in self._works:
                try:
                    work.wait()
                except HorovodInternalError:
                    raise
                except Exception as error:
                    raise HorovodInternalError(f"{self._what} failed: {error}") from error
            finish, self._finish = self._finish, None
            self._result = finish()
        return self._result  # type: ignore[return-value]  # set by finish(), which returns T

    def __repr__(self) -> str:
        state = "done" if self.poll() else "running"
        return f"<hvd handle: {self._what}, {state}>"


def done(value: T, what: str) -> Handle[T]:
    """A handle whose result is already there (a job of one rank)."""
    return Handle([], lambda: value, what)


def poll(handle: Handle[T]) -> bool:
    """Whether ``handle``'s collectives have finished (``synchronize`` would not wait)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"poll takes a handle from an *_async call, got {type(handle).__name__}")
    return handle.poll()


def synchronize(handle: Handle[T]) -> T:
    """Wait for ``handle`` and return its result (the output tensor(s))."""
    if not isinstance(handle, Handle):
        raise TypeError(
            f"synchronize takes a handle from an *_async call, got {type(handle).__name__}")
    return handle.wait()
