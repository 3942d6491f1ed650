"""The bench's pool of ranks trains each run from the config ``scaledl train`` would build from
the run's flags: the config values (``train_overrides``) and the command (``train_command``)
give the same :class:`TrainConfig` for every method of the comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaledl.bench.methods import METHODS, BenchSpec, train_command, train_overrides
from scaledl.cli import train as train_cli
from scaledl.cli.main import build_parser
from scaledl.train.config import build_config

SPEC = BenchSpec(workers=3, lr=0.0125, seed=2, batch_size=8, eval_every=5,
                 data_dir="/data/somewhere", momentum=0.5)
"""Every value changed from its default, so a value the pool dropped would show."""


@pytest.mark.parametrize("name", list(METHODS))
def test_pool_config_is_the_commands_config(name: str) -> None:
    method, out, spec = METHODS[name], Path("runs/x"), SPEC
    args = build_parser().parse_args(train_command(method, spec, out))
    from_flags = train_cli._config(args)
    from_values = build_config({}, train_overrides(method, spec, out))
    assert from_values == from_flags
    assert from_values.parallel.workers == spec.workers + (1 if method.needs_server else 0)
