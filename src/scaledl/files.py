"""Output files written whole or not at all.

A command that worked for minutes must not leave half a result behind when its disk fills, nor
destroy the previous result at the same path: :func:`write_files` stages each file beside its
destination and renames it into place only once every file is written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["Writer", "write_files"]

Writer = Callable[[Path], object]
"""Writes one output file at the path it is given."""


def write_files(outputs: Sequence[tuple[Path, Writer]]) -> None:
    """Write every ``(path, writer)`` or none: each regular (or new) file is written to a
    temporary file beside it and renamed into place once all are written, so a failure (a full
    disk) leaves neither a partial file nor a temporary one, and an older file at the path
    survives it; a path that is not a regular file (``/dev/stdout``) is written directly.  An
    ``OSError`` becomes a one-line ``ValueError`` naming the path."""
    staged: list[tuple[Path, Path]] = []
    current = outputs[0][0] if outputs else Path()
    try:
        for current, writer in outputs:
            current.parent.mkdir(parents=True, exist_ok=True)
            if current.exists() and not current.is_file():
                writer(current)
                continue
            target = Path(os.path.realpath(current))  # through a symlink, not over it
            handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                            suffix=".partial")
            os.close(handle)
            staged.append((Path(name), target))
            os.chmod(name, 0o666 & ~_umask())  # as a file created there would have
            writer(Path(name))
        for temporary, path in staged:
            current = path
            os.replace(temporary, path)
    except OSError as error:
        raise ValueError(f"cannot write {current}: {error.strerror or error}; nothing was "
                         "written: free space there or choose another path") from None
    finally:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
