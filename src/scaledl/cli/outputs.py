"""Output paths of the commands, checked before any work starts.

A benchmark that runs for minutes and then cannot write its ``--json`` has lost its result, so
every command checks each output option first: a file option must not name a directory, a
directory option must not name a file, and the place must be writable -- tried, not guessed
from permission bits (root passes every permission check, yet a read-only file system or a
path under a regular file still refuses).  Missing parent directories are fine: the writers
create them.  Each problem is a one-sentence ``ValueError`` naming the option, the path and the
fix.  Nothing is left behind: a probe file is removed at once.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_output_file", "check_output_dir", "check_plot_file"]


def check_output_file(path: str | Path, option: str) -> Path:
    """``path`` as a :class:`Path` once a file can be written there; else ``ValueError``."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file path, e.g. "
                         f"{option} {path / 'results.json'}")
    if path.exists():
        try:
            with open(path, "ab"):
                pass
        except OSError as error:
            raise ValueError(f"{option} {path} cannot be written ({error.strerror}); choose a "
                             "writable path") from None
        if path.is_file():  # replaced by a file staged beside it (scaledl.files.write_files)
            _check_writable_ancestor(Path(os.path.realpath(path)).parent, option, path)
        return path
    _check_writable_ancestor(path.parent, option, path)
    return path


def check_output_dir(path: str | Path, option: str) -> Path:
    """``path`` as a :class:`Path` once a directory there can be created or written in."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is an existing file, not a directory; give a "
                         "directory path (it is created if missing)")
    _check_writable_ancestor(path, option, path)
    return path


def check_plot_file(path: str | Path, option: str) -> Path:
    """:func:`check_output_file`, and the suffix must be an image format matplotlib writes."""
    path = check_output_file(path, option)
    if path.suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if path.suffix[1:].lower() not in formats:
            raise ValueError(f"{option} {path} has suffix {path.suffix!r}, not an image format; "
                             f"use one of .{', .'.join(sorted(formats))} (e.g. .png)")
    return path


def _check_writable_ancestor(directory: Path, option: str, path: Path) -> None:
    """The nearest existing ancestor of ``directory`` (itself included) is a directory in which
    a file can be created."""
    existing = directory.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{option} {path} lies under {existing}, which is a file, not a "
                         "directory; choose another path")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(f"{option} {path} cannot be written: {existing} refuses new files "
                         f"({error.strerror}); choose a writable location") from None
