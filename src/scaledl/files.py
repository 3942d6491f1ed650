"""Output files written whole or not at all.

A command that worked for minutes must not leave half a result behind when its disk fills, nor
destroy the previous result at the same path: :func:`write_files` stages each file beside its
destination (:func:`create_temporary`) and renames it into place only once every file is
written.  Checkpoints (:mod:`scaledl.train.checkpoint`) stage the same way.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["Writer", "write_files", "create_temporary", "TMP_PREFIX"]

Writer = Callable[[Path], object]
"""Writes one output file at the path it is given."""

TMP_PREFIX = ".tmp-"
"""How a staged file's name starts (``.tmp-<name>.<random>``, beside its destination)."""


def create_temporary(path: Path) -> tuple[int, Path]:
    """A new, exclusively created file beside ``path``, with mode 0666 less the umask (as
    ``open(path, "w")`` would make it; ``tempfile.mkstemp`` makes 0600), and its descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        staged = path.parent / f"{TMP_PREFIX}{path.name}.{secrets.token_hex(6)}"
        try:
            return os.open(staged, flags, 0o666), staged
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}; remove {TMP_PREFIX}* files")


def write_files(outputs: Sequence[tuple[Path, Writer]]) -> None:
    """Write every ``(path, writer)`` or none: each regular (or new) file is written to a
    temporary file beside it and renamed into place once all are written, so a failure (a full
    disk) leaves neither a partial file nor a temporary one, and an older file at the path
    survives it; a path that is not a regular file (``/dev/stdout``) is written directly.  An
    ``OSError`` becomes a one-line ``ValueError`` naming the path."""
    staged: list[tuple[Path, Path]] = []
    current, placed = (outputs[0][0] if outputs else Path()), 0
    try:
        for current, writer in outputs:
            current.parent.mkdir(parents=True, exist_ok=True)
            if current.exists() and not current.is_file():
                writer(current)
                continue
            target = Path(os.path.realpath(current))  # through a symlink, not over it
            handle, temporary = create_temporary(target)
            os.close(handle)
            staged.append((temporary, target))
            writer(temporary)
        for temporary, path in staged:
            current = path
            os.replace(temporary, path)
            placed += 1
    except OSError as error:
        done = "nothing was written" if not placed else \
            f"{', '.join(str(path) for _, path in staged[:placed])} was written"
        raise ValueError(f"cannot write {current}: {error.strerror or error}; {done}: free "
                         "space there or choose another path") from None
    finally:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
