"""pytest at the clone's root: every code block of README.md and docs/*.md is a test as well
(tests/docs/blocks.py says how each language runs and which comments steer it)."""

from tests.docs.blocks import pytest_collect_file, pytest_runtest_makereport

__all__ = ["pytest_collect_file", "pytest_runtest_makereport"]
