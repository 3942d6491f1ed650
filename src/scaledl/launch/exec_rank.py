"""``python -m scaledl.launch.exec_rank COMMAND [ARGS...]``: how ``scaledl run`` starts each rank.

It asks to die with the launcher (``PR_SET_PDEATHSIG``, which the command keeps across
``exec``), so a launcher killed by SIGKILL leaves no rank running; it leaves its process id in
the directory ``SCALEDL_RUN_PIDS`` names, so the launcher can stop, once the job has ended,
whatever a rank left in its process group (torch's agent stops only the groups of ranks still
running); then it becomes the command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

from scaledl.processes import die_with_parent

__all__ = ["main", "PID_DIR_ENV", "COMMAND_NOT_RUN"]

PID_DIR_ENV = "SCALEDL_RUN_PIDS"
"""The directory where each rank leaves an empty file named by its process id."""
COMMAND_NOT_RUN = 127
"""Exit code when the command cannot be executed (a shell's for a command not found)."""


def main(argv: list[str]) -> NoReturn:
    """Die with the parent, record this process, and execute ``argv``."""
    die_with_parent()
    directory = os.environ.pop(PID_DIR_ENV, None)
    if directory:
        Path(directory, str(os.getpid())).touch()
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        sys.stderr.write(f"scaledl run: cannot execute {argv[0]!r}: {error.strerror}\n")
        sys.exit(COMMAND_NOT_RUN)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m scaledl.launch.exec_rank COMMAND [ARGS...]")
    main(sys.argv[1:])
