"""Background checkpoints: copy the state at a step boundary, write it while training goes on.

A step never waits for the disk.  :meth:`CheckpointWriter.submit` takes a *snapshot* of the
state (every tensor copied to CPU memory, so later steps cannot change what is written) and
hands it to one writer thread, which computes the checksum and writes the file atomically with
:func:`~scaledl.train.checkpoint.write_checkpoint` (temporary file, fsync, rename, ``latest``,
pruning).  At most one snapshot exists at a time, so the memory held is bounded by one copy of
the state:

- a periodic checkpoint that comes due while the previous one is still being written is
  **skipped** (logged), rather than making the step wait or queueing a second copy; the next
  one comes at its usual time;
- a checkpoint that must exist (the last one of a run, ``wait=True``) waits for the write in
  flight, then is written and waited for.

A write that fails (a full disk) is re-raised by the next :meth:`submit`, :meth:`wait` or
:meth:`close`, so a run never goes on believing it has a checkpoint it does not have.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from scaledl.train.checkpoint import write_checkpoint

__all__ = ["CheckpointWriter", "snapshot"]

log = logging.getLogger(__name__)


def snapshot(value: Any) -> Any:
    """A copy of ``value`` whose tensors live in fresh CPU memory (containers rebuilt with the
    same types; other values shared, as they are immutable)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        copied = type(value)()
        for key, item in value.items():
            copied[key] = snapshot(item)
        return copied
    if type(value) in (list, tuple):
        return type(value)(snapshot(item) for item in value)
    return value


class CheckpointWriter:
    """Writes a run directory's checkpoints on one background thread, one at a time."""

    def __init__(self, run_dir: str | Path, keep_last: int = 2) -> None:
        self.run_dir = Path(run_dir)
        self.keep_last = keep_last
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._writing: int | None = None
        self.written: list[int] = []
        """Steps whose checkpoint is complete on disk, in order."""
        self.skipped: list[int] = []
        """Steps whose periodic checkpoint was skipped because a write was in flight."""

    @property
    def busy(self) -> bool:
        """Whether a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, step: int, state: Mapping[str, Any], wait: bool = False) -> bool:
        """Snapshot ``state`` and write it as step ``step``'s checkpoint in the background;
        return False when it was skipped (a write in flight and not ``wait``).  With ``wait``
        the call returns once this checkpoint is on disk."""
        if self.busy and not wait:
            self.skipped.append(step)
            log.info("checkpoint at step %d skipped: step %s's is still being written", step,
                     self._writing)
            return False
        self.wait()
        copied = snapshot(dict(state))
        self._writing = step
        self._thread = threading.Thread(target=self._write, args=(step, copied),
                                        name="scaledl-checkpoint", daemon=True)
        self._thread.start()
        if wait:
            self.wait()
        return True

    def _write(self, step: int, state: dict[str, Any]) -> None:
        start = time.perf_counter()
        try:
            path = write_checkpoint(self.run_dir, step, state, self.keep_last)
        except BaseException as error:  # noqa: BLE001 - re-raised on the training thread
            self._error = error
            return
        self.written.append(step)
        log.info("checkpoint %s (%.2f s in the background)", path.name,
                 time.perf_counter() - start)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight (at most ``timeout`` seconds); re-raise its error;
        return whether nothing is in flight any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return False
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return True

    def close(self, timeout: float | None = None) -> None:
        """Finish the write in flight (a run that fails still completes its last good
        checkpoint); after ``timeout`` seconds give up, leaving the daemon thread behind."""
        if not self.wait(timeout):
            log.warning("checkpoint of step %s still being written after %s s; abandoning it",
                        self._writing, timeout)
