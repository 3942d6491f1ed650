"""``scaledl bench``: the dispatcher of the benchmarks, one module per subcommand.

``scaledl bench collectives`` (:mod:`scaledl.cli.bench_collectives`), ``scaledl bench train``
(:mod:`scaledl.cli.bench_train`) and ``scaledl bench algorithms``
(:mod:`scaledl.cli.bench_algorithms`) each register their own parser with ``add_parser(kinds)``
and set their own ``run`` as the handler; this module only groups them under ``bench``.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

from scaledl.cli import bench_algorithms, bench_collectives, bench_train

__all__ = ["add_parser", "run", "BENCHMARKS"]

BENCHMARKS: dict[str, ModuleType] = {
    "collectives": bench_collectives, "train": bench_train, "algorithms": bench_algorithms,
}
"""Each benchmark's subcommand name and module, in the order ``--help`` lists them."""


def add_parser(subparsers: Any) -> None:
    """Register ``bench`` and its benchmarks (collectives, train, algorithms)."""
    bench = subparsers.add_parser(
        "bench", help="measure collectives, training throughput and training algorithms",
        description="Benchmarks, each beside its baseline in the same run.")
    kinds = bench.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for module in BENCHMARKS.values():
        module.add_parser(kinds)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.benchmark`` names."""
    return int(BENCHMARKS[args.benchmark].run(args))
