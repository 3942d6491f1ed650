"""The doc tester itself: each language and marker does what tests/docs/blocks.py says, and a
block that does not do what its document says fails."""

from __future__ import annotations

import time
import unittest
from collections.abc import Iterator
from pathlib import Path

import pytest
from sybil import Document
from sybil.evaluators.skip import Skipper

from tests.docs.blocks import (
    SYBIL, BlockFailure, console_steps, is_document, run_command, set_up, tear_down,
)

FENCE = "```"


@pytest.fixture
def document(tmp_path: Path) -> Iterator[Document]:
    path = tmp_path / "page.md"
    path.write_text(PAGE)
    parsed = SYBIL.parse(path)
    set_up(parsed.namespace)
    yield parsed
    tear_down(parsed.namespace)


PAGE = f"""# A page

{FENCE}bash
echo made > made.txt
test -f examples/train.py
{FENCE}

{FENCE}bash
false
echo never
{FENCE}

{FENCE}console
$ printf 'one\\ntwo  three\\nfour\\n'
one
two three
...
{FENCE}

{FENCE}console
$ echo actual
expected
{FENCE}

{FENCE}toml
[optim]
lr = 0.1
{FENCE}

{FENCE}toml
[optim]
learning_rate = 0.1
{FENCE}

{FENCE}json
{{"a": [1, 2]}}
{FENCE}

{FENCE}
a synopsis
{FENCE}

{FENCE}yaml
a: 1
{FENCE}

<!-- skip: next "needs 2 GPU hosts" -->
{FENCE}python
raise RuntimeError("skipped blocks do not run")
{FENCE}

<!-- skip: needs 2 GPU hosts, said shortly -->
{FENCE}python
raise RuntimeError("skipped blocks do not run")
{FENCE}

{FENCE}python
from pathlib import Path
assert Path("made.txt").read_text() == "made\\n"   # the work directory of the page
value = 41
{FENCE}

{FENCE}python
assert value == 41                                  # the page's namespace, in order
{FENCE}

<!-- launch: python; python -X dev -->
{FENCE}python
import sys
assert "value" not in globals()                     # a program of its own
sys.exit(0)
{FENCE}

<!-- launch: python -->
{FENCE}python
raise SystemExit("the program failed")
{FENCE}

<!-- save: prog.py -->
{FENCE}python
print("saved, not run")
{FENCE}

{FENCE}sh
test "$(python prog.py)" = "saved, not run"
{FENCE}
"""

OUTCOMES = ["pass", "fail", "pass", "fail", "pass", "fail", "pass", "skip", "fail", "skip",
            "skip", "pass", "pass", "pass", "fail", "pass", "pass"]
"""What each block of PAGE must do, in order."""


def _outcome(example: object) -> str:
    try:
        example.evaluate()  # type: ignore[attr-defined]
    except unittest.SkipTest:
        return "skip"
    except (AssertionError, ValueError):
        return "fail"
    return "pass"


def test_every_block_does_what_its_language_and_markers_say(document: Document) -> None:
    outcomes = []
    for example in document.examples():
        outcome = _outcome(example)  # a skip marker too: it steers the block after it
        if not isinstance(example.region.evaluator, Skipper):
            outcomes.append(outcome)
    assert outcomes == OUTCOMES


def test_a_failing_command_reports_its_output(tmp_path: Path) -> None:
    with pytest.raises(BlockFailure, match=r"exited with 3; its output:\nwhy"):
        run_command(["bash", "-c", "echo why; exit 3"], tmp_path)


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(BlockFailure, match="ran past 1 s"):
        run_command(["bash", "-c", "sleep 30 & sleep 30; wait"], tmp_path, timeout_s=1)
    assert time.monotonic() - start < 10


def test_console_steps_split_commands_and_their_output() -> None:
    source = "$ scaledl simulate \\\n    --sweep\nline 1\nline 2\n$ true\n"
    assert console_steps(source) == [("scaledl simulate \\\n    --sweep", "line 1\nline 2\n"),
                                     ("true", "\n")]


def test_only_readme_and_docs_pages_are_collected(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    assert is_document(root / "README.md") and is_document(root / "docs" / "training.md")
    assert not is_document(root / "benchmarks" / "README.md")
    assert not is_document(tmp_path / "README.md")
