"""Log lines of the command-line tool: ``[rank N]`` for a rank, a label for a supervisor.

Handlers are configured once, here, for every ``scaledl`` command (conventions: rank 0 at INFO,
the others at WARNING); library modules only log through ``logging.getLogger(__name__)``.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_logging", "label_logs"]


def configure_logging(rank: int) -> None:
    """Log to stderr with a ``[rank N]`` prefix; rank 0 at INFO, the others at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        f"[rank {rank}] %(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    ))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for noisy in ("matplotlib", "torch"):  # their INFO lines are for their developers
        logging.getLogger(noisy).setLevel(logging.WARNING)


def label_logs(label: str) -> None:
    """A supervisor is no rank: its log lines start with ``label`` (``scaledl run``), not the
    ``[rank 0]`` of :func:`configure_logging`."""
    formatter = logging.Formatter(f"{label} %(asctime)s %(levelname)s: %(message)s",
                                  datefmt="%H:%M:%S")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
