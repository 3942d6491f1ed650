"""The simulator predicts today what it predicted when the golden record was written
(tests/unit/sim_golden.py): sweeps over the presets and ``scaledl simulate`` command lines,
printed lines and JSON alike.  The published cases' predictions are checked against the same
record in test_sim_reproduce.py, which predicts them anyway."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit import sim_golden


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return sim_golden.load()


def test_the_sweeps_over_the_presets_are_unchanged(golden: dict[str, Any]) -> None:
    diffs = sim_golden.differences(golden["sweeps"], sim_golden.sweeps())
    assert not diffs, diffs[:5]


def test_the_command_lines_print_and_write_what_they_did(golden: dict[str, Any]) -> None:
    diffs = sim_golden.differences(golden["cli"], sim_golden.cli())
    assert not diffs, diffs[:5]


def test_a_changed_prediction_is_a_difference() -> None:
    """The comparison itself: 1e-10 relative passes, 1e-8 does not, a residue of 1e-16 next to
    zero passes, 1e-9 does not, text must match."""
    record = {"a": [1.0, {"b": "text"}]}
    assert not sim_golden.differences(record, {"a": [1.0 + 1e-10, {"b": "text"}]})
    assert sim_golden.differences(record, {"a": [1.0 + 1e-8, {"b": "text"}]})
    assert not sim_golden.differences({"a": 0.0}, {"a": -1.1e-16})
    assert sim_golden.differences({"a": 0.0}, {"a": 1e-9})
    assert sim_golden.differences(record, {"a": [1.0, {"b": "other"}]})
    assert sim_golden.differences(record, {"a": [1.0]})
