"""The console a command prints its report to.

A report is never narrower than it needs, so that no cell is cut short (rich fits a table to a
narrower width by cutting cells to "…", numbers included).  A terminal that reports its size
gets colour; anything else gets plain text: a file, a pipe, and the pseudo-terminal that
``mpirun``/``mpiexec`` give their ranks, which says it is a terminal but has no size (0 x 0),
whatever it forwards to.  Rich's ``FORCE_COLOR`` or ``TTY_COMPATIBLE`` still ask for colour.
Before, a report redirected to a file under ``mpiexec`` came out 80 columns wide, its cells cut
to ``…``, with colour codes in the text, and so did one on a terminal narrower than the report.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

__all__ = ["report_console", "sized_terminal"]


def sized_terminal() -> bool:
    """True when standard output is a terminal that reports a size."""
    try:
        return sys.stdout.isatty() and os.get_terminal_size(sys.stdout.fileno()).columns > 0
    except (OSError, ValueError, AttributeError):  # closed, replaced, or no descriptor
        return False


def report_console(min_width: int) -> Any:
    """A rich console for a report, at least ``min_width`` columns wide (returned as ``Any``:
    rich ships no stubs this project checks against)."""
    from rich.console import Console

    # Never narrower than the report: rich fits a table to a narrower width by cutting its
    # cells to "…", numbers included; a line the terminal wraps can still be read.
    width = max(min_width, shutil.get_terminal_size().columns)
    if sized_terminal() or os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE"):
        return Console(width=width)  # rich's colour rules, which honour those and NO_COLOR
    return Console(width=width, force_terminal=False, no_color=True)
