"""The ``scaledl`` entry point: argument parsing, logging set-up and error reporting.

Each subcommand is a module with ``add_parser(subparsers)`` (which registers its parser and sets
``handler``) and ``run(args) -> int``.  Errors a user can cause (``ValueError``/``TypeError`` and
argparse's) print one line, ``scaledl: error: <message>``, and exit with code 2; set
``SCALEDL_DEBUG=1`` to see the traceback instead.  A job that cannot form (ranks that do not
meet within the timeout: :class:`scaledl.bootstrap.RendezvousError`) prints one line too and
exits with code 1, as any other failed run does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from scaledl import __version__
from scaledl.cli.logs import configure_logging
from scaledl.launchers import launcher_rank

__all__ = ["main", "build_parser", "UsageError", "commands", "COMMANDS"]


COMMANDS = {"train": "scaledl.cli.train", "run": "scaledl.cli.run",
            "bench": "scaledl.cli.bench", "simulate": "scaledl.cli.simulate",
            "cluster": "scaledl.cli.cluster"}
"""Each subcommand's module, in the order ``--help`` lists them."""


def commands(names: Sequence[str] | None = None) -> tuple[ModuleType, ...]:
    """The modules of the subcommands ``names`` (default: all), imported on first call: they
    load torch, which :func:`main` does inside its Ctrl-C handler."""
    unknown = [name for name in names or () if name not in COMMANDS]
    if unknown:
        raise ValueError(f"no scaledl subcommand {unknown[0]!r}; choose from {', '.join(COMMANDS)}")
    return tuple(importlib.import_module(COMMANDS[name]) for name in names or COMMANDS)


class UsageError(ValueError):
    """A command line that does not parse."""


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``scaledl`` parser with every subcommand registered, or only the subcommand
    ``only``: a worker of ``scaledl train`` then does not import the other four (a fifth of a
    second of every worker's start-up)."""
    parser = _Parser(
        prog="scaledl",
        description="Scalable distributed deep-learning training on PyTorch.",
    )
    parser.add_argument("--version", action="version", version=f"scaledl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in commands(None if only is None else [only]):
        module.add_parser(subparsers)
    return parser


def _one_line(error: BaseException) -> str:
    text = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``scaledl`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    configure_logging(launcher_rank())
    try:
        return _run(arguments)
    except KeyboardInterrupt:  # also while torch and the subcommands are still loading
        sys.stderr.write("scaledl: interrupted\n")
        return 130


def _run(arguments: list[str]) -> int:
    from scaledl.bootstrap import RendezvousError
    from scaledl.collectives.communicator import debug_enabled

    try:
        # The full parser only where it is needed: help, a version, a misspelt command.
        only = arguments[0] if arguments and arguments[0] in COMMANDS else None
        args = build_parser(only).parse_args(arguments)
        args.argv = arguments
        return int(args.handler(args))
    except (ValueError, TypeError) as error:
        if debug_enabled():
            raise
        sys.stderr.write(f"scaledl: error: {_one_line(error)}\n")
        return 2
    except RendezvousError as error:
        if debug_enabled():
            raise
        sys.stderr.write(f"scaledl: error: {_one_line(error)}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
