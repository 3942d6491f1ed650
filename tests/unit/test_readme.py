"""README.md opens with the two commands, and CI runs exactly the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _first_code_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert match, "README.md must open with a code block holding the two commands"
    return [line for line in match.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_setup_and_test_commands() -> None:
    lines = _first_code_block()
    assert len(lines) == 2, lines
    setup, tests = lines
    assert "pip install torch==2.13.0" in setup and "scaledl " in setup
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    test_command = _first_code_block()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    # The README's line activates the venv first; CI has activated it already.
    activate = ". .venv/bin/activate &&"
    assert test_command.startswith(activate), test_command
    command = test_command[len(activate):].strip()
    assert command in [line.strip() for line in ci], f"{command!r} not in .ci/run"


def test_the_two_test_runs_together_run_every_test_once() -> None:
    """The unit tests (one process each) run on both cores, everything else (real process
    groups, launchers, timing-sensitive stops) one test at a time after them."""
    runs = [run.strip() for run in _first_code_block()[1].split("&&")[1:]]
    assert runs == ["python -m pytest -q -n 2 tests/unit",
                    "python -m pytest -q --ignore=tests/unit"], runs
