"""docs/training.md names every key of a ``scaledl train --config`` file in its table, as
scaledl.train.config reads them (it once said the keys were the flags: ``batch-size``)."""

from __future__ import annotations

import dataclasses
import re

from scaledl.strategies.catalogue import option_fields
from scaledl.train.config import SECTIONS
from tests.docs.blocks import ROOT

STRATEGY_OPTIONS = set(option_fields())
"""What training.md calls "the strategy options" (under ``[parallel]``): every strategy's."""


def _documented_tables() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "training.md").read_text()
    match = re.search(r"Which table a key belongs in:(.*?)\.\s", text, re.S)
    assert match, "training.md lost its list of the TOML keys by table"
    tables: dict[str, set[str]] = {}
    for part in match.group(1).split(";"):
        table = re.search(r"in\s+`\[(\w+)\]`", part)
        assert table, part
        names = set(re.findall(r"`(\w+)`", part[:table.start()]))
        if "strategy options" in part:
            names |= STRATEGY_OPTIONS
        tables[table.group(1)] = names
    return tables


def test_training_md_lists_every_config_key_in_its_table() -> None:
    expected = {name: {field.name for field in dataclasses.fields(cls)}
                for name, cls in SECTIONS.items()}
    assert _documented_tables() == expected
