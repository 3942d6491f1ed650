"""The CLI's one-line errors: SCALEDL_DEBUG means the same in the CLI as in the collectives
(0/false/off are off), and a misspelt subcommand names every subcommand.

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


def test_a_misspelt_subcommand_names_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """A first word that is no subcommand gets the full parser (a subcommand gets only its
    own, tests/unit/test_layering.py), so the error lists them all, in ``--help``'s order."""
    from scaledl.cli.main import COMMANDS

    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'trian'" in err
    assert "(choose from " + ", ".join(f"'{name}'" for name in COMMANDS) + ")" in err
