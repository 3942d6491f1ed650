"""``scaledl bench collectives``: the command line around :mod:`scaledl.bench.collectives`.

Started by hand, it checks its options and relaunches itself as ``--ranks`` workers under
torchrun (:mod:`scaledl.launch.local`); each worker joins the group with
:func:`scaledl.bootstrap.init`, measures, and rank 0 prints the table (:func:`render_table`)
and writes the JSON, the plot and (``--calibrate``) the cost-model calibration.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
from functools import partial
from pathlib import Path
from typing import Any

from rich.markup import escape

from scaledl.bench.collectives import (
    DEFAULT_ALGORITHMS, DTYPES, PEER_ALGORITHMS, BenchConfig, select_algorithms,
)
from scaledl.bench.peers import PEERS, parse_peers
from scaledl.bench.report import format_bytes, header_lines
from scaledl.calibration.bench_file import (
    BenchReport, Measurement, native_ratios, peer_rows, write_json,
)
from scaledl.bootstrap import read_launch_env
from scaledl.launch.local import run_distributed, under_launcher
from scaledl.cli.console import report_console
from scaledl.cli.outputs import check_output_file, check_plot_file
from scaledl.collectives.registry import ALGORITHMS, AUTO
from scaledl.collectives.schedule import Collective
from scaledl.topology import TOPOLOGY_ENV, Topology

__all__ = ["add_parser", "run", "parse_bytes", "message_sizes", "build_config", "render_table"]

log = logging.getLogger(__name__)

DEFAULT_RANKS = 2

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(I?B)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Parse ``"4K"``, ``"256M"``, ``"1G"``, ``"64KiB"`` or ``"4096"`` into bytes (K = 1024)."""
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(
            f"size {text!r} is not a byte count; write an integer with an optional K, M or G "
            "suffix (powers of 1024), e.g. 4K or 256M"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def message_sizes(min_bytes: int, max_bytes: int, step_factor: int = 4) -> list[int]:
    """``min_bytes, min_bytes * f, ...`` up to ``max_bytes`` (added at the end if not reached)."""
    if min_bytes < 1:
        raise ValueError(f"--min-bytes {min_bytes} must be at least 1")
    if max_bytes < min_bytes:
        raise ValueError(f"--max-bytes {max_bytes} is smaller than --min-bytes {min_bytes}")
    if step_factor < 2:
        raise ValueError(f"--step-factor {step_factor} must be at least 2")
    sizes = [min_bytes]
    while sizes[-1] * step_factor <= max_bytes:
        sizes.append(sizes[-1] * step_factor)
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


def add_parser(kinds: Any) -> None:
    """Register the ``collectives`` benchmark under ``scaledl bench``."""
    names = ", ".join(list(ALGORITHMS) + [AUTO])
    p = kinds.add_parser(
        "collectives", help="latency, algbw and busbw of every algorithm (nccl-tests style)",
        description="Time collective algorithms per message size on local workers (or under a "
                    "launcher) and compare them with the native torch.distributed collective.",
    )
    p.add_argument("--ranks", "--workers", dest="ranks", type=int, default=None,
                   help=f"local worker processes (default {DEFAULT_RANKS}; under a launcher "
                        "the launcher's count); --workers as in the other commands")
    p.add_argument("--collectives", default="allreduce",
                   help=f"comma list of {', '.join(c.value for c in Collective)}")
    p.add_argument("--algorithms", default=None,
                   help="comma list, or 'all' (every one but auto); default "
                        f"{', '.join(DEFAULT_ALGORITHMS)} (tree and chain instead of the first "
                        f"three for broadcast and reduce; shm only inside one host); choices: "
                        f"{names}")
    p.add_argument("--peers", default=None,
                   help=f"comma list of peer libraries timed beside scaledl, interleaved, on the "
                        f"same buffers: {', '.join(PEERS)} (mpi under mpirun/mpiexec only); "
                        f"the default algorithms are then {','.join(PEER_ALGORITHMS)}")
    p.add_argument("--min-bytes", default="4K", help="smallest message, e.g. 4K (default)")
    p.add_argument("--max-bytes", default="256M", help="largest message, e.g. 256M (default)")
    p.add_argument("--step-factor", type=int, default=4, help="size multiplier per step")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per size (default: from the warm-up time)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("--target-seconds", type=float, default=0.5,
                   help="timed seconds per algorithm and size when --iters is not given")
    p.add_argument("--topology", default=None,
                   help="network layout innermost first, e.g. 2x2 (needed by hierarchical, torus)")
    p.add_argument("--chunk-bytes", default=None, help="executor pipelining chunk, e.g. 1M")
    p.add_argument("--p2p-bytes", default="64M", help="message of the p2p ceiling (default 64M)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds any blocking distributed call may take (default 300)")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a busbw plot (PNG) here")
    p.add_argument("--calibrate", action="store_true",
                   help="fit auto's cost model and write it to the calibration file")
    p.add_argument("--explain", action="store_true", help="print auto's choice for every size")
    p.set_defaults(handler=run)


def build_config(args: argparse.Namespace) -> BenchConfig:
    """Validate the options into a :class:`BenchConfig` (``ValueError`` on bad input)."""
    peers = parse_peers(args.peers)
    spec = args.algorithms
    if spec is None and peers:
        spec = ",".join(PEER_ALGORITHMS)
    algorithms = select_algorithms(args.collectives.split(","), spec)
    sizes = message_sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes),
                          args.step_factor)
    chunk = parse_bytes(args.chunk_bytes) if args.chunk_bytes is not None else None
    if parse_bytes(args.p2p_bytes) < 1:
        raise ValueError(f"--p2p-bytes {args.p2p_bytes} must be at least 1 byte (default 64M)")
    config = BenchConfig(
        algorithms=algorithms, sizes=tuple(sizes), dtype=args.dtype, iters=args.iters,
        warmup=args.warmup, target_seconds=args.target_seconds, topology=args.topology,
        chunk_bytes=chunk, p2p_bytes=parse_bytes(args.p2p_bytes), explain=args.explain,
        peers=peers,
    )
    if args.timeout <= 0:
        raise ValueError(f"--timeout {args.timeout} must be positive")
    if args.calibrate and len(sizes) < 2:
        raise ValueError("--calibrate needs at least two message sizes; widen --min-bytes and "
                         "--max-bytes")
    return config


def _check_layout(config: BenchConfig, world_size: int, launched: bool) -> None:
    if config.topology is not None:
        Topology.parse(config.topology, world_size)
    needs = config.needs_topology()
    if needs and config.topology is None and not os.environ.get(TOPOLOGY_ENV) and not launched:
        raise ValueError(
            f"algorithm {needs[0]!r} needs the network layout: pass --topology RxH (R ranks per "
            f"host, H hosts, R*H = {world_size}), e.g. --topology {world_size}x1"
        )


def _check_outputs(args: argparse.Namespace) -> None:
    """Every file the benchmark writes at its end can be written, checked before it starts."""
    from scaledl.collectives.auto import CALIBRATION_ENV, calibration_path

    if args.json is not None:
        check_output_file(args.json, "--json")
    if args.plot is not None:
        check_plot_file(args.plot, "--plot")
    if args.calibrate:
        check_output_file(calibration_path(), f"--calibrate (file {CALIBRATION_ENV})")


def run(args: argparse.Namespace) -> int:
    """Check the options, then launch the workers (or be one)."""
    ranks = DEFAULT_RANKS if args.ranks is None else args.ranks
    if ranks < 1:
        raise ValueError(f"--ranks/--workers {ranks} must be at least 1")
    config = build_config(args)
    _check_outputs(args)
    launched = under_launcher()
    world_size = read_launch_env().world_size if launched else ranks
    if launched and args.ranks is not None and args.ranks != world_size:
        log.warning("--ranks/--workers %d ignored: the launcher started %d ranks", args.ranks,
                    world_size)
    _check_layout(config, world_size, launched)
    return run_distributed(ranks, args.argv, lambda: _worker(args, config))


def _config_dict(args: argparse.Namespace, config: BenchConfig, chunk_bytes: int) -> dict[str, Any]:
    return {
        "command": ["scaledl", *args.argv],
        "algorithms": {c.value: list(names) for c, names in config.algorithms.items()},
        "sizes": list(config.sizes), "dtype": config.dtype, "iters": config.iters,
        "warmup": config.warmup, "target_seconds": config.target_seconds,
        "topology": config.topology, "chunk_bytes": chunk_bytes, "p2p_bytes": config.p2p_bytes,
        "calibrate": args.calibrate, "peers": list(config.peers),
    }


def _worker(args: argparse.Namespace, config: BenchConfig) -> int:
    import torch.distributed as dist

    import scaledl
    from scaledl import bootstrap
    from scaledl.bench import report as rep
    from scaledl.bench.collectives import measure_memcpy, measure_p2p, run_benchmark
    from scaledl.calibration.fit import describe
    from scaledl.collectives.communicator import communicator_for

    topology = bootstrap.init(backend=bootstrap.HOST_BACKEND, timeout=args.timeout,
                              topology=config.topology)
    try:
        rank, world_size = topology.rank, topology.world_size
        console = report_console(140) if rank == 0 else None
        echo = partial(console.print, markup=False, highlight=False) if console else None
        p2p = measure_p2p(config.p2p_bytes, rank, world_size)
        memcpy = measure_memcpy(config.p2p_bytes)
        run = run_benchmark(config, topology, echo)
        if console is None:
            return 0
        comm = communicator_for(None)
        env = rep.environment(str(dist.get_backend()), world_size, topology.spec)
        result = BenchReport(env, _config_dict(args, config, comm.chunk_bytes),
                             run.measurements, p2p, memcpy=memcpy, copies=run.copies,
                             peers=run.peers, skipped_peers=run.skipped)
        if args.calibrate:
            result.calibration = _calibrate(result, topology, comm.cost_model, comm.chunk_bytes)
        render_table(result, console)
        if result.calibration is not None:
            console.print(describe(result.calibration), markup=False, highlight=False)
            console.print(f"calibration written to {result.calibration['path']}",
                          markup=False, highlight=False)
        if args.json is not None:
            write_json(result, args.json)
            log.info("wrote %s", args.json)
        if args.plot is not None:
            rep.write_plot(result, args.plot)
            log.info("wrote %s", args.plot)
        return 0
    finally:
        scaledl.shutdown()


def _calibrate(
    result: Any, topology: Topology, prior: Any, chunk_bytes: int
) -> dict[str, Any]:
    from scaledl.calibration.fit import calibrate
    from scaledl.collectives.auto import calibration_path

    itemsize = DTYPES[result.config["dtype"]].itemsize
    model, summary = calibrate(result.measurements, topology, itemsize, prior, chunk_bytes)
    # A busy machine time-shares even ranks that have a core each: every wait then costs a
    # scheduler's slice, and the fit says so (docs/algorithms.md, "auto").  Say it was busy.
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    summary["load_average"] = load
    if prior.host_cores and load > prior.host_cores + topology.world_size:
        log.warning("the machine was busy while calibrating (load average %.1f on %d cores, "
                    "%d of it this benchmark's ranks): the fit describes a loaded machine; "
                    "rerun --calibrate when it is quiet", load, prior.host_cores,
                    topology.world_size)
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.to_json() + "\n")
    summary["path"] = str(path)
    summary["model"] = json.loads(model.to_json())
    return summary


def render_table(report: BenchReport, console: Any) -> None:
    """Print the header, the results table, the p2p ceiling and the ratios vs native."""
    from rich.table import Table

    console.print("[bold]scaledl bench collectives[/bold]")
    for line in header_lines(report):
        console.print(line, markup=False, highlight=False)
    p2p = report.p2p_gbps
    if report.p2p is not None and p2p is not None:
        console.print(f"point-to-point rank 0 -> 1, {format_bytes(report.p2p.nbytes)}: "
                      f"{p2p:.3f} GB/s (median of {len(report.p2p.times_s)})")
    if report.memcpy is not None:
        console.print(f"memory copy on one core, {format_bytes(report.memcpy.nbytes)}: "
                      f"{report.memcpy.gbps:.3f} GB/s (the shared-memory ceiling)")
    table = Table(show_lines=False)
    for title in ("size", "collective", "algorithm", "iters", "avg us", "median us", "min us",
                  "max us", "algbw GB/s", "busbw GB/s", "busbw/p2p"):
        table.add_column(title, justify="left" if title in ("collective", "algorithm") else "right")
    for m in report.measurements:
        fraction = f"{m.busbw_gbps / p2p:.2f}" if p2p else "-"
        table.add_row(
            format_bytes(m.nbytes), m.collective, _shown(m), str(len(m.times_s)),
            *(f"{us:.1f}" for us in (m.avg_us, m.median_us, m.min_us, m.max_us)),
            f"{m.algbw_gbps:.3f}", f"{m.busbw_gbps:.3f}", fraction,
        )
    console.print(table)
    render_peers(report, console)
    baseline = "torch" if any(m.algorithm == "torch" for m in report.measurements) else "native"
    for ratio in native_ratios(report.measurements, baseline):
        console.print(
            f"{ratio['collective']} at {format_bytes(ratio['nbytes'])}: "
            f"{ratio['algorithm']} / {baseline} busbw = {ratio['busbw_ratio']:.2f}x"
        )


def render_peers(report: BenchReport, console: Any) -> None:
    """The peers' table: per size and scaledl algorithm, its median time and busbw, each peer's
    median time over it (``> 1``: scaledl faster), the memory copies of that size and the share
    of the memory bound scaledl reached.  Nothing when no peer ran."""
    from rich.table import Table

    rows = peer_rows(report.measurements, report.copies)
    if not rows:
        return
    names = list(dict.fromkeys(name for row in rows for name in row["vs"]))
    for name, label in report.peers.items():  # the peers that were timed, with their version
        if name in names:
            console.print(f"peer {name}: {label}", markup=False, highlight=False)
    copies = {copy.nbytes: copy for copy in report.copies}
    table = Table(title="against the peers: medians of interleaved samples; a peer's time, "
                        "and its ratio to scaledl's (> 1: scaledl faster)")
    titles = ["size", "collective", "algorithm", "us", "busbw GB/s", *names,
              "copy 1 core / all GB/s", "bound GB/s", "of bound"]
    for title in titles:
        table.add_column(title, justify="left" if title in ("collective", "algorithm") else "right")
    for row in rows:
        copy = copies.get(row["nbytes"]) if row["collective"] == "allreduce" else None
        fraction = row["bound_fraction"]
        table.add_row(
            format_bytes(row["nbytes"]), row["collective"],
            escape(row["algorithm"] if row["resolved"] in (None, row["algorithm"])
                   else f"{row['algorithm']} ({row['resolved']})"),
            f"{row['median_us']:.1f}", f"{row['busbw_gbps']:.2f}",
            *(f"{row['peer_us'][n]:.1f} ({row['vs'][n]:.2f}x)" if n in row["vs"] else "-"
              for n in names),
            f"{copy.one_core_gbps:.1f} / {copy.all_ranks_gbps:.1f}" if copy else "-",
            f"{copy.allreduce_busbw_gbps:.2f}" if copy and copy.allreduce_busbw_gbps > 0 else "-",
            f"{fraction:.0%}" if fraction is not None else "-",
        )
    console.print(table)


def _shown(measurement: Measurement) -> str:
    """The algorithm as asked, with what it ran as when that differs (auto, paths per level)."""
    resolved = measurement.resolved
    if resolved is None or resolved == measurement.algorithm:
        return escape(measurement.algorithm)
    return escape(f"{measurement.algorithm} ({resolved})")
