"""``python -m scaledl ...``: the ``scaledl`` command, for an environment whose scripts are not
on PATH (``python -m scaledl train``, ``torchrun --nproc-per-node 2 -m scaledl train``)."""

import sys

from scaledl.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
