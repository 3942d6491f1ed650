"""SCALEDL_DEBUG means the same in the CLI as in the collectives: 0/false/off are off.

Before the fix the CLI treated any non-empty value (``0`` included) as on and printed a traceback
instead of the one-line error.
"""

from __future__ import annotations

import pytest

from scaledl.cli.main import main


@pytest.mark.parametrize("value", ["0", "false", "off", ""])
def test_debug_off_values_give_the_one_line_error(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SCALEDL_DEBUG", value)
    assert main(["cluster", "run", "--hosts", "2", "--port", "70000", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scaledl: error: ") and err.count("\n") == 1


def test_debug_on_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEDL_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown model 'nope'"):  # needs no iproute2 or root
        main(["simulate", "--model", "nope"])
