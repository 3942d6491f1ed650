"""What a fresh interpreter has imported after some statements: the start-up cost a module
adds to every process that imports it (a CLI worker, a user's ``import scaledl``)."""

from __future__ import annotations

import ast
import subprocess
import sys


def modules_loaded_by(statements: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh Python has in ``sys.modules`` after ``statements``."""
    code = (f"import sys\n{statements}\n"
            f"print(sorted(m for m in {modules!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded: list[str] = ast.literal_eval(done.stdout.strip())
    return loaded
