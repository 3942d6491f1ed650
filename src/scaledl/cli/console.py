"""The console a command prints its report to.

A terminal that reports its size gets rich's usual output: colour, and tables fitted to its
width.  Anything else gets plain text at least as wide as the report needs, so that no cell is
cut short: a file, a pipe, and the pseudo-terminal that ``mpirun``/``mpiexec`` give their ranks,
which says it is a terminal but has no size (0 x 0), whatever it forwards to; rich's
``FORCE_COLOR`` or ``TTY_COMPATIBLE`` still ask for its terminal output.  Before, a report
redirected to a file under ``mpiexec`` came out 80 columns wide, its cells cut to ``…``, with
colour codes in the text.
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
    """A rich console for a report at least ``min_width`` columns wide when not shown on a
    sized terminal (returned as ``Any``: rich ships no stubs this project checks against)."""
    from rich.console import Console

    if sized_terminal() or os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE"):
        return Console()  # rich's own rules, which honour those variables (and NO_COLOR)
    return Console(width=max(min_width, shutil.get_terminal_size().columns),
                   force_terminal=False, no_color=True)
