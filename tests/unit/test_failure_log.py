"""The suite's failure log (``tests/conftest.py``): with ``SCALEDL_FAILURE_LOG`` set, each failure
is appended as it happens, so a device check stopped by its deadline still has the tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FAILURE_LOG, pytest_runtest_logreport


def _report(outcome: str) -> pytest.TestReport:
    return pytest.TestReport("tests/x.py::test_y", ("tests/x.py", 1, "test_y"), {}, outcome,
                             "AssertionError: 1 == 2" if outcome == "failed" else None, "call",
                             sections=[("Captured stderr call", "rank 1 died")])


def test_failures_are_appended_as_they_happen(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "failures.txt"
    monkeypatch.setenv(FAILURE_LOG, str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytest_runtest_logreport(_report("passed"))
    assert not log.exists()
    pytest_runtest_logreport(_report("failed"))
    pytest_runtest_logreport(_report("failed"))
    text = log.read_text()
    assert text.count("== tests/x.py::test_y (call)") == 2
    assert "AssertionError: 1 == 2" in text and "rank 1 died" in text


def test_nothing_is_written_without_the_variable_or_from_a_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAILURE_LOG, raising=False)
    monkeypatch.chdir(tmp_path)
    pytest_runtest_logreport(_report("failed"))
    monkeypatch.setenv(FAILURE_LOG, str(tmp_path / "failures.txt"))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    pytest_runtest_logreport(_report("failed"))
    assert list(tmp_path.iterdir()) == []
