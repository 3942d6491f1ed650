"""What a refused command prints: one ``scaledl: error:`` line on stderr and nothing on stdout."""

from __future__ import annotations

import pytest


def one_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """The last command's single ``scaledl: error:`` line (nothing on stdout), holding every
    fragment."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaledl: error: "), captured.err
    assert captured.out == "", captured.out
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
