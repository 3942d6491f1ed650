"""The doc tester: every fenced code block of README.md and docs/*.md runs as a pytest test.

Sybil finds the blocks; what a block's language says decides how it runs:

``python``
    Sybil's Python parser: run in the document's namespace (a document's blocks share names,
    in order) with the document's work directory as the current directory.  Sybil's
    ``<!-- invisible-code-block: python -->`` comments run too (set-up and checks a reader
    does not need to see).
``bash``, ``sh``
    run by ``bash -euo pipefail`` in the document's work directory under a timeout; a command
    that fails fails the test with its output.
``console``
    ``$ command`` lines run as above; the lines after each are its expected output, compared as
    doctest compares (``...`` matches anything, runs of whitespace are equal).
``toml``
    parsed; a file of ``scaledl train``'s tables is built into its validated ``TrainConfig``.
``json``
    parsed.
``text`` or no language
    shown, not run: reported as a skipped test that says so.
any other
    a failure asking for one of the languages above.

The work directory of a document is a fresh temporary directory holding a link to the clone's
``examples/``, so commands read as they would from the clone's root (``python
examples/train.py``) and leave their run directories behind in the temporary directory.

Markers, HTML comments on the lines just above a block:

``<!-- skip: next "needs 2 GPU hosts" -->``
    Sybil's skip: the next block is reported skipped with that reason (``skip: next
    if(condition, reason="...")`` skips only when the condition holds; the document's
    namespace has ``os`` and ``shutil`` for conditions).  ``<!-- skip: needs 2 GPU hosts -->``,
    a reason that does not start with one of Sybil's actions (``next``, ``start``, ``end``), is
    short for the first form.
``<!-- launch: python; torchrun --standalone --nproc-per-node 2 -->``
    the Python block below is a program: it is written to a file and run under each launcher
    in turn, as a separate process (multi-rank examples, examples that start process groups).
``<!-- save: train_lightning.py -->``
    the Python block below is written to that file in the work directory (a later shell block
    of the same document runs it) after its syntax is checked.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.integration.pytest import SybilItem
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[2]
"""The clone's root: README.md, docs/ and examples/ are found from here."""

TIMEOUT_S = 100.0
"""Seconds one block (or one launch of one block) may run; below pytest-timeout's 120."""

WORKDIR = "__doc_workdir__"
"""The key of a document's work directory in its namespace."""

SHELL_LANGUAGES = ("bash", "sh")
TEXT_LANGUAGES = ("", "text")
CHECKED_LANGUAGES = ("python", *SHELL_LANGUAGES, "console", "toml", "json", *TEXT_LANGUAGES)

_MARKER = re.compile(r"^<!--\s*(?P<name>[\w-]+):\s*(?P<arguments>.*?)\s*-->$")
_OUTPUT_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class BlockFailure(AssertionError):
    """A documented command or program did not do what the document says."""


def is_document(path: Path) -> bool:
    """README.md at the root and every ``docs/*.md``: the documents whose blocks are tests."""
    path = path.resolve()
    return path == ROOT / "README.md" or (path.parent == ROOT / "docs" and path.suffix == ".md")


def markers_before(text: str, start: int) -> dict[str, str]:
    """The ``<!-- name: arguments -->`` comments on the lines just above ``start``."""
    markers: dict[str, str] = {}
    for line in reversed(text[:start].splitlines()):
        match = _MARKER.match(line.strip())
        if match is None:
            break
        markers.setdefault(match["name"], match["arguments"])
    return markers


def workdir(example: Example) -> Path:
    return Path(example.namespace[WORKDIR])


def environment() -> dict[str, str]:
    """This environment as a user who follows docs/launching.md has it: this interpreter's
    scripts first on PATH (``scaledl``, ``torchrun``), Open MPI allowed to run as root (its
    ``OMPI_ALLOW_RUN_AS_ROOT`` variables), and a free ``MASTER_PORT``, so that an MPI job of a
    block meets no other job of this machine on the default port."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MASTER_PORT=str(_free_port()))
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_command(argv: list[str], cwd: Path, timeout_s: float = TIMEOUT_S) -> str:
    """Run ``argv`` in its own session; its output, or :class:`BlockFailure` with the output when
    it exits non-zero or outlives ``timeout_s`` (then its whole process group is killed)."""
    process = subprocess.Popen(argv, cwd=cwd, env=environment(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise BlockFailure(f"{shlex.join(argv)} ran past {timeout_s:.0f} s; its output:\n"
                           f"{_tail(output)}") from None
    if process.returncode != 0:
        raise BlockFailure(f"{shlex.join(argv)} exited with {process.returncode}; its output:\n"
                           f"{_tail(output)}")
    return output


def _tail(output: str, lines: int = 60) -> str:
    return "\n".join(output.splitlines()[-lines:])


def run_shell(example: Example) -> None:
    """A ``bash`` block: every command must succeed."""
    run_command(["bash", "-euo", "pipefail", "-c", str(example.parsed)], workdir(example))


def console_steps(source: str) -> list[tuple[str, str]]:
    """``$ command`` lines (continued by a trailing backslash) and the output shown under each."""
    steps: list[tuple[str, list[str]]] = []
    continued = False
    for line in source.splitlines():
        if continued:
            steps[-1] = (steps[-1][0] + "\n" + line, steps[-1][1])
        elif line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise ValueError(f"a console block starts with a '$ ' command line, got {line!r}")
        continued = line.endswith("\\") and not steps[-1][1]
    return [(command, "\n".join(output) + "\n") for command, output in steps]


def run_console(example: Example) -> None:
    """A ``console`` block: each command succeeds and prints what the block shows under it."""
    checker = doctest.OutputChecker()
    for command, want in console_steps(str(example.parsed)):
        got = run_command(["bash", "-euo", "pipefail", "-c", command], workdir(example))
        if not checker.check_output(want, got, _OUTPUT_FLAGS):
            difference = checker.output_difference(doctest.Example(command, want), got,
                                                   _OUTPUT_FLAGS)
            raise BlockFailure(f"$ {command}\n{difference}")


def check_toml(example: Example) -> None:
    """A ``toml`` block parses; one of ``scaledl train``'s tables builds a valid config."""
    from scaledl.train.config import SECTIONS, build_config, tomllib

    values = tomllib.loads(str(example.parsed))
    if set(values) & set(SECTIONS):
        build_config(values, {})


def check_json(example: Example) -> None:
    json.loads(str(example.parsed))


def text_block(example: Example) -> None:
    language = example.region.lexemes.get("arguments") or "no language"
    raise unittest.SkipTest(f"{language}: shown, not run (output or a synopsis)")


def unknown_language(example: Example) -> None:
    language = example.region.lexemes.get("arguments")
    raise BlockFailure(f"no runner for a {language!r} block; give it one of: "
                       f"{', '.join(name or 'no language' for name in CHECKED_LANGUAGES)}")


class Launch:
    """Run a Python block as a program under each launcher of its ``launch`` marker."""

    def __init__(self, launchers: str) -> None:
        self.launchers = [shlex.split(launcher) for launcher in launchers.split(";")]
        if not all(self.launchers):
            raise ValueError(f"launch: {launchers!r} names an empty launcher")

    def __call__(self, example: Example) -> None:
        directory = workdir(example)
        script = directory / f"{Path(example.path).stem}_line{example.line}.py"
        script.write_text(str(example.parsed))
        for launcher in self.launchers:
            argv = [sys.executable, *launcher[1:]] if launcher[0] == "python" else launcher
            run_command([*argv, script.name], directory)

    def __repr__(self) -> str:
        return f"Launch({self.launchers!r})"


class Save:
    """Write a Python block to a file of the work directory, for a later shell block."""

    def __init__(self, name: str) -> None:
        if not name or Path(name).name != name:
            raise ValueError(f"save: {name!r} must be a file name without a directory")
        self.name = name

    def __call__(self, example: Example) -> None:
        compile(str(example.parsed), self.name, "exec")
        (workdir(example) / self.name).write_text(str(example.parsed))


class InWorkdir:
    """Sybil's own evaluation of a Python block, with the work directory as the current one."""

    def __init__(self, evaluate: Callable[[Example], Any]) -> None:
        self.evaluate = evaluate

    def __call__(self, example: Example) -> Any:
        here = Path.cwd()
        os.chdir(workdir(example))
        try:
            return self.evaluate(example)
        finally:
            os.chdir(here)


class SkipMarkers(SkipParser):
    """Sybil's skip parser, also taking ``skip: REASON`` for ``skip: next "REASON"``."""

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in super().__call__(document):
            action, _ = region.parsed
            if action not in ("next", "start", "end"):
                text = document.text[region.start:region.end]
                reason = text.split("skip:", 1)[1].rsplit("-->", 1)[0].strip()
                region.parsed = ("next", repr(reason))
            yield region


class PythonBlocks:
    """Sybil's Python parser, with ``launch`` and ``save`` markers honoured."""

    def __init__(self) -> None:
        self.parser = PythonCodeBlockParser()

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.parser(document):
            markers = markers_before(document.text, region.start)
            if "launch" in markers:
                region.evaluator = Launch(markers["launch"])
            elif "save" in markers:
                region.evaluator = Save(markers["save"])
            elif region.evaluator is not None:
                region.evaluator = InWorkdir(region.evaluator)
            yield region


class OtherBlocks:
    """Fenced blocks in any language but Python and the shell: checked, shown or refused."""

    HANDLED = ("python", *SHELL_LANGUAGES)

    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(language=r"[\w+-]*",
                                          mapping={"language": "arguments", "source": "source"})

    def __call__(self, document: Document) -> Iterable[Region]:
        evaluators = {"console": run_console, "toml": check_toml, "json": check_json,
                      **dict.fromkeys(TEXT_LANGUAGES, text_block)}
        for region in self.lexer(document):
            language = region.lexemes["arguments"]
            if language in self.HANDLED:
                continue
            region.parsed = region.lexemes["source"]
            region.evaluator = evaluators.get(language, unknown_language)
            yield region


def set_up(namespace: dict[str, Any]) -> None:
    """A document's work directory, and the names its skip conditions may use."""
    directory = Path(tempfile.mkdtemp(prefix="scaledl-doc-"))
    (directory / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    namespace.update({WORKDIR: str(directory), "os": os, "shutil": shutil})


def tear_down(namespace: dict[str, Any]) -> None:
    """Leave no process group behind a document whose blocks started one; remove its files."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            import scaledl

            scaledl.shutdown()
    shutil.rmtree(namespace[WORKDIR], ignore_errors=True)


SYBIL = Sybil(
    parsers=[
        SkipMarkers(),
        PythonBlocks(),
        CodeBlockParser(language="bash", evaluator=run_shell),
        CodeBlockParser(language="sh", evaluator=run_shell),
        OtherBlocks(),
    ],
    patterns=["*.md"],
    path=str(ROOT),
    setup=set_up,
    teardown=tear_down,
    name="docs",
)
_collect = SYBIL.pytest()


def pytest_collect_file(file_path: Path, parent: Any) -> Any:
    """The pytest hook (imported by the root conftest.py): collect README.md and docs/*.md."""
    return _collect(file_path, parent) if is_document(file_path) else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A skipped block is reported at its line of its document (pytest would name the line of
    its own module that turned Sybil's ``unittest.SkipTest`` into a skip)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and isinstance(item, SybilItem) and isinstance(report.longrepr, tuple):
        report.longrepr = (str(item.path), item.example.line, report.longrepr[2])
