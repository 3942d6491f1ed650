"""The strategy catalogue: a strategy declared in one file is known everywhere that asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from torch import nn

from scaledl.strategies.catalogue import names_with, strategies, strategy_class
from scaledl.strategies.periodic import PeriodicStrategy
from scaledl.train.config import ParallelConfig, build_config
from scaledl.train.setup import _strategy_options, algorithms_for


def _gossip() -> type[PeriodicStrategy]:
    class Gossip(PeriodicStrategy):
        """An experiment: everything the rest of scaledl needs to know is declared here."""

        name = "test-gossip"
        collectives = "rooted"
        keywords = ("timeline",)

        @property
        def model(self) -> nn.Module:  # pragma: no cover - never built here
            return self.module

        def step(self) -> None:  # pragma: no cover
            pass

    return Gossip


@pytest.fixture(autouse=True)
def gossip() -> Iterator[type[PeriodicStrategy]]:
    """The experiment's class, withdrawn afterwards: a class without a ``name`` of its own is a
    base, not a strategy (other tests see the package's strategies only)."""
    cls = _gossip()
    yield cls
    for withdrawn in (cls, *cls.__subclasses__()):
        if "name" in vars(withdrawn):
            delattr(withdrawn, "name")
    assert not any(name.startswith("test-gossip") for name in strategies())


def test_a_strategy_defined_in_one_file_is_in_the_catalogue(
        gossip: type[PeriodicStrategy]) -> None:
    assert strategy_class("test-gossip") is gossip
    assert "test-gossip" in names_with("periodic")
    assert "test-gossip" not in names_with("server")


def test_the_config_check_and_option_routing_read_the_catalogue() -> None:
    assert ParallelConfig(strategy="test-gossip", tau=3).tau == 3
    with pytest.raises(ValueError, match="alpha 0.1 does not apply to strategy 'test-gossip'"):
        ParallelConfig(strategy="test-gossip", alpha=0.1)
    assert "tree" in algorithms_for("test-gossip") and "ring" not in algorithms_for("test-gossip")
    options = _strategy_options(build_config({}, {"strategy": "test-gossip", "tau": 2}), None,
                                None, world_size=2)
    assert set(options) == {"timeline", "tau"} and options["tau"] == 2


def test_unknown_names_and_duplicates_are_one_line_errors(
        gossip: type[PeriodicStrategy]) -> None:
    with pytest.raises(ValueError, match="strategy 'nope' is unknown; choose one of allreduce"):
        strategy_class("nope")
    with pytest.raises(ValueError, match="unknown trait"):
        names_with("fast")

    twin = type("Twin", (gossip,), {"name": "test-gossip", "__module__": gossip.__module__})
    try:
        with pytest.raises(ValueError, match="both named 'test-gossip'"):
            strategies()
    finally:
        twin.name = "test-gossip-twin"
    assert "test-gossip-twin" in strategies()


def test_the_package_strategies_and_their_traits() -> None:
    catalogue = strategies()
    assert {"allreduce", "reduce-broadcast", "sync-easgd", "easgd", "local-sgd", "async-sgd",
            "async-msgd", "hogwild-sgd", "async-easgd", "async-measgd",
            "hogwild-easgd"} <= set(catalogue)
    assert set(names_with("server")) == {"async-sgd", "async-msgd", "hogwild-sgd", "async-easgd",
                                         "async-measgd", "hogwild-easgd"}
    assert set(names_with("elastic")) == {"sync-easgd", "easgd", "async-easgd", "async-measgd",
                                          "hogwild-easgd"}
    assert algorithms_for("sync-easgd", "allreduce") != algorithms_for("sync-easgd", "tree")
