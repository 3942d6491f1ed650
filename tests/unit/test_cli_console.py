"""Reports print plain and wide except on a terminal that reports its size: under mpiexec a
rank's output is a pseudo-terminal of size 0 x 0, which rich took for an 80-column colour
terminal, so a report redirected to a file had its cells cut to "…" and colour codes in it."""

from __future__ import annotations

import fcntl
import io
import os
import struct
import sys
import termios
from collections.abc import Iterator

import pytest
from rich.table import Table

from scaledl.cli.console import report_console, sized_terminal


@pytest.fixture
def pty() -> Iterator[tuple[int, io.TextIOWrapper]]:
    """A fresh pseudo-terminal (size 0 x 0): its descriptor and a text stream on it."""
    leader, follower = os.openpty()
    stream = open(follower, "w", closefd=True)  # noqa: SIM115 - closed below
    try:
        yield follower, stream
    finally:
        stream.close()
        os.close(leader)


def _on(monkeypatch: pytest.MonkeyPatch, stream: io.TextIOWrapper) -> None:
    """Standard output on ``stream`` (inside the test: pytest's capture swaps it at the call)."""
    monkeypatch.setattr(sys, "stdout", stream)
    for name in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


def _resize(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def test_a_launchers_sizeless_terminal_gets_a_plain_wide_report(
    pty: tuple[int, io.TextIOWrapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    _on(monkeypatch, pty[1])
    assert sys.stdout.isatty() and not sized_terminal()
    console = report_console(140)
    assert console.width >= 140 and not console.is_terminal and console.no_color
    table = Table("a column with a long heading", "another column with a long heading")
    table.add_row("a value that is long enough", "and another long value here")
    with console.capture() as captured:
        console.print(table)
    text = captured.get()
    assert "…" not in text and "\x1b[" not in text and "a value that is long enough" in text


def test_a_terminal_that_reports_its_size_keeps_rich_output(
    pty: tuple[int, io.TextIOWrapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    _on(monkeypatch, pty[1])
    _resize(pty[0], 30, 60)
    assert sized_terminal()
    console = report_console(140)
    assert console.is_terminal and not console.no_color and console.width >= 140
    table = Table("size", "a column with a long heading", "another column with a long heading")
    table.add_row("4 KiB", "248.3", "2924.1")
    with console.capture() as captured:  # a terminal narrower than the report cut numbers
        console.print(table)
    assert "…" not in captured.get() and "2924.1" in captured.get()


def test_a_file_gets_a_plain_wide_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not sized_terminal()
    assert report_console(170).width >= 170


def test_force_color_still_asks_for_rich_terminal_output(
    pty: tuple[int, io.TextIOWrapper], monkeypatch: pytest.MonkeyPatch
) -> None:
    _on(monkeypatch, pty[1])
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert report_console(140).is_terminal
