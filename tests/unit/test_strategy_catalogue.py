"""The strategy catalogue is the only source of a strategy's facts: a strategy declared in one
file (here, this test file) is known to the configuration check, the option routing, the
algorithm check, ``scaledl train``'s flags, ``scaledl bench algorithms``' table and the
simulator, with nothing else edited."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from torch import nn

from scaledl.bench.methods import METHODS, BenchSpec, train_command
from scaledl.cli.main import build_parser
from scaledl.cli.simulate import job_from_args
from scaledl.cli.train import flags
from scaledl.sim.collective import CollectiveSimulator
from scaledl.sim.iteration import simulate_iteration, simulated_strategies
from scaledl.sim.network import LinkClass, Network
from scaledl.sim.profile import Layer, ModelProfile
from scaledl.strategies.catalogue import names_with, option_takers, strategies, strategy_class
from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.options import PeriodicOptions
from scaledl.strategies.periodic import PeriodicStrategy
from scaledl.topology import Topology
from scaledl.train.config import ParallelConfig, build_config
from scaledl.train.setup import _strategy_options, algorithms_for


def _gossip() -> type[PeriodicStrategy]:
    @dataclass(frozen=True)
    class GossipOptions(PeriodicOptions):
        """The experiment's options: ``tau``, which must be even."""

        def _check(self) -> None:
            if self.tau is not None and self.tau % 2:
                raise ValueError(f"tau {self.tau} must be even for test-gossip; give "
                                 f"--tau {self.tau + 1}")

    class Gossip(PeriodicStrategy):
        """An experiment: everything the rest of scaledl needs to know is declared here."""

        name = "test-gossip"
        collectives = "rooted"
        keywords = ("timeline",)
        options = GossipOptions
        timing = "periodic"
        comparison = MethodRow(35, "Gossip (test)", tau=2)

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
    assert "test-gossip" in option_takers("tau")


def test_the_config_check_and_option_routing_read_the_catalogue() -> None:
    assert ParallelConfig(strategy="test-gossip", tau=4).tau == 4
    with pytest.raises(ValueError, match="tau 3 must be even for test-gossip; give --tau 4"):
        ParallelConfig(strategy="test-gossip", tau=3)
    with pytest.raises(ValueError, match="alpha 0.1 does not apply to strategy 'test-gossip'"):
        ParallelConfig(strategy="test-gossip", alpha=0.1)
    assert "tree" in algorithms_for("test-gossip") and "ring" not in algorithms_for("test-gossip")
    options = _strategy_options(build_config({}, {"strategy": "test-gossip", "tau": 2}), None,
                                None, world_size=2)
    assert options == {"timeline": None, "tau": 2}


def test_scaledl_train_offers_it() -> None:
    strategy_help = dict((name, text) for name, _, text in flags())["strategy"]
    assert "test-gossip" in strategy_help
    args = build_parser().parse_args(["train", "--strategy", "test-gossip", "--tau", "6"])
    assert (args.strategy, args.tau) == ("test-gossip", 6)


def test_the_bench_compares_it_in_its_row() -> None:
    names = list(METHODS)
    assert names.index("local-sgd") < names.index("test-gossip") < names.index("sync-easgd")
    method = METHODS["test-gossip"]
    assert (method.label, method.tau, method.needs_server, method.elastic) == (
        "Gossip (test)", 2, False, False)
    args = train_command(method, BenchSpec(workers=2), Path("out"))
    assert args[args.index("--tau") + 1] == "2" and "--alpha" not in args


def test_the_simulator_models_it_as_it_declares() -> None:
    assert "test-gossip" in simulated_strategies()
    layers = (Layer("a", 4000, 1e6), Layer("b", 8000, 2e6))
    profile = ModelProfile("toy", layers, ((3000, (0, 1)),))
    network = Network("toy", LinkClass.from_bandwidth("in", 1e-6, 40),
                      LinkClass.from_bandwidth("out", 1e-5, 10), gamma=1e-11)
    sim = CollectiveSimulator(Topology((2, 2)), network)
    toy, sync = (simulate_iteration(profile, sim, 8, strategy, "tree", flops=1e9, tau=2)
                 for strategy in ("test-gossip", "sync-easgd"))
    assert toy.strategy == "test-gossip" and toy.iteration_s == sync.iteration_s > 0
    args = build_parser().parse_args(["simulate", "--strategy", "test-gossip", "--gpus", "4",
                                     "--model", "mlp"])
    job_from_args(args).check()


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
    assert set(simulated_strategies()) - {"test-gossip"} == {"allreduce", "reduce-broadcast",
                                                             "sync-easgd", "easgd"}
