"""docs/training.md's ``scaledl train`` synopsis names every flag the parser takes, every
strategy of the catalogue, and, for each strategy option, exactly the strategies that read it
(it once listed two strategies and left out fourteen flags)."""

from __future__ import annotations

import argparse
import fnmatch
import re

from scaledl.cli import train
from scaledl.strategies.catalogue import option_fields, option_takers, strategies
from tests.docs.blocks import ROOT

EASGD_FAMILY = ("easgd", "sync-easgd", "async-easgd", "async-measgd", "hogwild-easgd")
"""What the synopsis's "EASGD family" stands for (the names training.md gives it)."""

FLAG = re.compile(r"--[a-z][a-z-]*")


def _synopsis() -> str:
    text = (ROOT / "docs" / "training.md").read_text()
    match = re.search(r"## `scaledl train`\n+```text\n(.*?)```", text, re.S)
    assert match, "training.md lost the text block under its `scaledl train` heading"
    return match.group(1)


def _train_parser() -> argparse.ArgumentParser:
    subparsers = argparse.ArgumentParser(prog="scaledl").add_subparsers()
    train.add_parser(subparsers)
    parser = subparsers.choices["train"]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def test_synopsis_names_every_flag_and_no_other() -> None:
    documented = set(FLAG.findall(_synopsis()))
    accepted: set[str] = set()
    for action in _train_parser()._actions:
        names = [name for name in action.option_strings if name.startswith("--")]
        if not names or names == ["--help"]:
            continue
        accepted.update(names)
        # An alias (--timeout, --timeout-s) is documented once, under any of its names.
        assert documented & set(names), f"the synopsis leaves out {names[0]}"
    unknown = documented - accepted
    assert not unknown, f"the synopsis names flags the parser lacks: {sorted(unknown)}"


def test_synopsis_names_every_strategy() -> None:
    match = re.search(r"^S: (.*?)\n\n", _synopsis(), re.S | re.M)
    assert match, "the synopsis lost its line of --strategy names"
    names = re.findall(r"[a-z][a-z-]*[a-z]", match.group(1).replace("(default)", ""))
    assert sorted(names) == sorted(strategies())


def _option_rows() -> dict[str, set[str]]:
    """Each strategy option's flag -> the strategies its synopsis row names."""
    block = _synopsis().split("STRATEGY OPTIONS, each only for the strategies named:\n", 1)
    assert len(block) == 2, "the synopsis lost its STRATEGY OPTIONS rows"
    names = list(strategies())
    rows: dict[str, set[str]] = {}
    readers: set[str] = set()
    for line in block[1].splitlines():
        label, _, flags = line.partition("[")
        if label.strip():
            readers = set()
            for part in re.sub(r"\(.*?\)", "", label).split(","):
                part = part.strip()
                expanded = EASGD_FAMILY if part == "EASGD family" else fnmatch.filter(names, part)
                assert expanded, f"{part!r} names no strategy"
                readers.update(expanded)
        for flag in FLAG.findall("[" + flags):
            rows[flag] = readers
    return rows


def test_each_strategy_option_row_names_the_strategies_that_read_it() -> None:
    rows = _option_rows()
    for flag, readers in rows.items():
        assert readers == set(option_takers(flag[2:].replace("-", "_"))), flag
    expected = {"--" + name.replace("_", "-") for name in option_fields()}
    assert set(rows) == expected, f"rows {sorted(rows)} != strategy options {sorted(expected)}"


def test_config_section_names_every_strategy_option_key() -> None:
    text = (ROOT / "docs" / "training.md").read_text()
    match = re.search(r"the strategies' options \((.*?)\) go under `\[parallel\]`", text, re.S)
    assert match, "training.md's config section lost its list of the strategy options"
    assert sorted(re.findall(r"`(\w+)`", match.group(1))) == sorted(option_fields())
