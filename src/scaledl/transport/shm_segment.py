"""Shared-memory segments: one file per rank in ``/dev/shm``, mapped by the ranks of its host.

A segment is a file ``scaledl-<token>-r<rank>-p<pid>`` in the segment directory (``/dev/shm``,
or ``SCALEDL_SHM_DIR``), created owner-only (0600) so no other user of the host can read or
write a job's gradients.  Its layout:

====================  ====================================================================
bytes 0..511          header: magic, version, owner pid, owner start time, token, window
                      bytes, slots, rank, control lines
bytes 512..H-1        control words: one int64 per 64-byte cache line (sequence counters the
                      owner publishes and the peers read); H is a multiple of 4096
bytes H..             ``slots`` data windows of ``window`` bytes each
====================  ====================================================================

Lifetime: the owner creates and fully allocates the file (``posix_fallocate``, so a full
``/dev/shm`` is an error at creation, never a SIGBUS at first touch), every peer maps it, and the
owner unlinks it as soon as every peer has mapped it.  From then on nothing of the job is visible
in the directory, whatever happens to the processes (exit, exception, SIGTERM, SIGKILL): the
memory lives exactly as long as the last mapping.  Only a process killed inside that short
set-up window leaves a file behind; the next job on the host removes files whose owner process
is gone (:func:`remove_leftovers`).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "Segment", "SegmentError", "segment_dir", "remove_leftovers", "process_start_time",
    "process_alive", "needs_fence", "SHM_DIR_ENV",
]

log = logging.getLogger(__name__)

SHM_DIR_ENV = "SCALEDL_SHM_DIR"
"""Directory of the segments (default ``/dev/shm``); it must be a tmpfs shared by the host."""
MAGIC = 0x314C44454C414353  # "SCALEDL1", little-endian
VERSION = 1
PAGE = 4096
CONTROL_OFFSET = 512
LINE_WORDS = 8
"""int64 words per 64-byte cache line: each control word has a line of its own."""
_NAME = re.compile(r"^scaledl-[0-9a-f]+-r\d+-p(\d+)$")


class SegmentError(OSError):
    """A segment could not be created, allocated or opened."""


def segment_dir() -> Path:
    """Where segments live: ``SCALEDL_SHM_DIR`` or ``/dev/shm``."""
    return Path(os.environ.get(SHM_DIR_ENV, "").strip() or "/dev/shm")


def needs_fence() -> bool:
    """True on CPUs whose stores may become visible out of order (not x86): there, Python
    code has no memory barrier to order a data copy before the counter that publishes it."""
    return platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686")


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields if len(fields) > 19 else None


def process_start_time(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks after boot (None if there is none)."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None


def process_alive(pid: int, start_time: int) -> bool:
    """True while process ``pid`` runs and is the one that started at ``start_time`` (a zombie,
    dead but not yet reaped by its parent, is not alive)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == start_time


def remove_leftovers(directory: Path | None = None) -> list[Path]:
    """Remove segments of this user whose owner process is gone (a job killed while setting up);
    return the removed paths."""
    where = directory if directory is not None else segment_dir()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        match = _NAME.match(entry.name)
        try:
            if match is None or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if _owner_alive(Path(entry.path), int(match.group(1))):
                continue
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
    if removed:
        log.info("removed %d shared-memory segment(s) left by a killed job", len(removed))
    return removed


def _owner_alive(path: Path, pid: int) -> bool:
    """True while the process that created ``path`` runs (a reused pid does not count)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    started = int(fields[19])
    try:
        with open(path, "rb") as file:
            header = np.frombuffer(file.read(32), dtype=np.int64)
    except OSError:
        return True
    if len(header) < 4 or header[0] != MAGIC:
        return True  # still being created by a live process
    return int(header[2]) == pid and int(header[3]) == started


@dataclass
class Segment:
    """One rank's segment, mapped into this process (its own, or a peer's)."""

    path: Path
    memory: mmap.mmap
    window: int
    """Bytes of one data window."""
    slots: int
    """Data windows."""
    lines: int
    """Control lines (one int64 word on a 64-byte line each)."""

    @staticmethod
    def header_bytes(lines: int) -> int:
        """Bytes before the first data window: header and control lines, in whole pages."""
        used = CONTROL_OFFSET + lines * LINE_WORDS * 8
        return -(-used // PAGE) * PAGE

    @property
    def words(self) -> np.ndarray:
        """Header and control words as int64."""
        return np.frombuffer(self.memory, dtype=np.int64,
                             count=self.header_bytes(self.lines) // 8)

    def control(self, index: int) -> int:
        """Word index of control word ``index`` (each on its own cache line)."""
        return CONTROL_OFFSET // 8 + index * LINE_WORDS

    def data(self, slot: int) -> np.ndarray:
        """Data window ``slot`` as bytes."""
        start = self.header_bytes(self.lines) + slot * self.window
        return np.frombuffer(self.memory, dtype=np.uint8, count=self.window, offset=start)

    @property
    def header(self) -> tuple[int, ...]:
        """(magic, version, pid, start time, token, window, slots, rank, lines)."""
        return tuple(int(value) for value in self.words[:9])

    def close(self) -> None:
        """Unmap (views of the memory must be gone first; a still-referenced map stays)."""
        try:
            self.memory.close()
        except BufferError:  # numpy or torch views still alive: the map goes with them
            pass

    @classmethod
    def size_of(cls, window: int, slots: int, lines: int) -> int:
        """Bytes of a segment with ``slots`` windows of ``window`` bytes."""
        return cls.header_bytes(lines) + window * slots

    @classmethod
    def create(cls, token: int, rank: int, window: int, slots: int, lines: int) -> Segment:
        """Create, fully allocate and map this rank's segment (owner-only)."""
        directory = segment_dir()
        path = directory / f"scaledl-{token:x}-r{rank}-p{os.getpid()}"
        size = cls.size_of(window, slots, lines)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            raise SegmentError(error.errno, f"cannot create {path}: {error.strerror}") from None
        try:
            _allocate(fd, size, path)
            memory = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        segment = cls(path, memory, window, slots, lines)
        start = process_start_time(os.getpid()) or 0
        segment.words[:9] = [MAGIC, VERSION, os.getpid(), start, token, window, slots, rank,
                             lines]
        return segment

    @classmethod
    def open(
        cls, path: Path, token: int, window: int, slots: int, lines: int, pid: int
    ) -> Segment:
        """Map a peer's segment and check that it is the one the peer announced."""
        size = cls.size_of(window, slots, lines)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as error:
            raise SegmentError(error.errno, f"cannot open {path}: {error.strerror}") from None
        try:
            if os.fstat(fd).st_size != size:
                raise SegmentError(errno.EINVAL, f"{path} has the wrong size")
            memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        segment = cls(path, memory, window, slots, lines)
        magic, version, owner, _, found_token, found_window, found_slots, _, found_lines = (
            segment.header
        )
        if (magic, version, owner, found_token, found_window, found_slots, found_lines) != (
            MAGIC, VERSION, pid, token, window, slots, lines
        ):
            segment.close()
            raise SegmentError(errno.EINVAL, f"{path} is not the segment its peer announced")
        return segment


def _allocate(fd: int, size: int, path: Path) -> None:
    """Reserve every page now, so a full directory fails here instead of with SIGBUS later."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise SegmentError(error.errno, f"cannot allocate {size} bytes for {path}: "
                                            f"{error.strerror}") from None
    zeros = bytes(1 << 20)
    written = 0
    while written < size:
        try:
            written += os.write(fd, zeros[:min(len(zeros), size - written)])
        except OSError as error:
            raise SegmentError(error.errno, f"cannot allocate {size} bytes for {path}: "
                                            f"{error.strerror}") from None
