"""``scaledl simulate``: predict training time at 8..1024 GPUs from replayed collective plans.

``scaledl simulate --model resnet50 --gpus 256 --topology 4x16x4 --algorithm torus --device p100
--network ib-edr`` prints the iteration time, the communication share and the scaling
efficiency; ``--sweep`` runs 1, 2, 4, ... GPUs and writes a JSON and a PNG.
``scaledl simulate calibrate BENCH.json ...`` fits the link classes to ``scaledl bench
collectives --json`` output; ``scaledl simulate validate BENCH.json --calibration FILE`` prints
predicted against measured times.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaledl.cli.bench import parse_bytes
from scaledl.collectives.registry import ALGORITHMS
from scaledl.models.registry import available_models
from scaledl.collectives.auto import CostModel
from scaledl.sim.job import Job
from scaledl.topology import Topology
from scaledl.sim.presets import ALIASES, DEVICES, LINKS
from scaledl.sim.iteration import STRATEGIES, IterationResult

if TYPE_CHECKING:
    from scaledl.sim.native import Native  # scipy: loaded only by `simulate calibrate`

__all__ = ["add_parser", "run", "job_from_args", "format_result"]


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="resnet50", help=f"one of {', '.join(available_models())}")
    p.add_argument("--input-shape", default=None,
                   help="sample shape such as 3x224x224 (default: ImageNet or the model's own)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs (default: the topology's product)")
    p.add_argument("--topology", default=None,
                   help="axes innermost first, e.g. 4x16x4 = 4 GPUs per host, 16 hosts per "
                        "rack, 4 racks (default 4 per host)")
    p.add_argument("--algorithm", default="ring",
                   help="collective algorithm: "
                        + ", ".join(a for a, algo in ALGORITHMS.items() if algo.scheduled))
    p.add_argument("--strategy", default="allreduce", choices=STRATEGIES)
    p.add_argument("--device", default=None, help=f"one of {', '.join(DEVICES)} (default p100)")
    p.add_argument("--network", default=None,
                   help=f"inter-host link: {', '.join([*LINKS, *ALIASES])} (default ib-edr)")
    p.add_argument("--intra", default=None, help="intra-host link preset (default: the device's)")
    p.add_argument("--uplink", default=None, help="rack uplink preset (default: --network)")
    p.add_argument("--oversubscription", type=float, default=1.0,
                   help="rack uplink oversubscription (1 = non-blocking)")
    p.add_argument("--batch", type=int, default=32, help="samples per GPU per iteration")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size, MiB")
    p.add_argument("--tau", type=int, default=1, help="EASGD: exchange every tau steps")
    p.add_argument("--no-overlap", action="store_true",
                   help="communicate after backward (allreduce) / after compute (sync-easgd)")
    p.add_argument("--compute-time", type=float, default=None,
                   help="measured forward+backward seconds per iteration on one GPU")
    p.add_argument("--device-efficiency", type=float, default=None,
                   help="fraction of the device's peak FLOP/s training achieves")
    p.add_argument("--update-time", type=float, default=None, help="optimizer step, seconds")
    p.add_argument("--inter-latency", type=float, default=None, help="override, microseconds")
    p.add_argument("--inter-bandwidth", type=float, default=None, help="override, GB/s")
    p.add_argument("--intra-latency", type=float, default=None, help="override, microseconds")
    p.add_argument("--intra-bandwidth", type=float, default=None, help="override, GB/s")
    p.add_argument("--calibration", type=Path, default=None,
                   help="links from `scaledl simulate calibrate` instead of presets")
    p.add_argument("--sweep", action="store_true", help="simulate 1, 2, 4, ... GPUs up to --gpus")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON")
    p.add_argument("--plot", type=Path, default=None, help="sweep plot (PNG)")


def add_parser(subparsers: Any) -> None:
    """Register ``simulate`` with its ``calibrate`` and ``validate`` actions."""
    p = subparsers.add_parser(
        "simulate", help="predict iteration time and scaling efficiency at many GPUs",
        description="Replay scaledl's collective plans on a network model and simulate a "
                    "training iteration with bucketed overlap.")
    _job_options(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=False)
    cal = actions.add_parser("calibrate", help="fit link classes to bench JSON files")
    cal.add_argument("bench", nargs="+", type=Path, help="`scaledl bench collectives --json` files")
    cal.add_argument("-o", "--output", type=Path, default=Path("calibration.json"))
    cal.add_argument("--bench-topology", default=None, help="topology of the measurements "
                     "(default: from each file)")
    cal.add_argument("--placement", choices=("block", "cyclic"), default="block",
                     help="how the measured ranks sat on hosts (scaledl cluster run --placement)")
    val = actions.add_parser("validate", help="predicted vs measured collective times")
    val.add_argument("bench", nargs="+", type=Path)
    val.add_argument("--bench-topology", default=None)
    val.add_argument("--placement", choices=("block", "cyclic"), default="block")
    val.add_argument("--min-bytes", default="1M", help="smallest message compared (default 1M)")
    val.add_argument("--markdown", action="store_true", help="print a markdown table")
    actions.add_parser("reproduce", help="the seed papers' results beside predictions")
    p.set_defaults(handler=run)


def job_from_args(args: argparse.Namespace) -> Job:
    """The :class:`Job` the options describe."""
    gpus = args.gpus
    if gpus is None:
        from scaledl.topology import parse_axes
        import math

        gpus = math.prod(parse_axes(args.topology)) if args.topology else 8
    if gpus < 1:
        raise ValueError(f"--gpus {gpus} must be >= 1")
    if args.batch < 1:
        raise ValueError(f"--batch {args.batch} must be >= 1")
    shape = _input_shape(args.input_shape) if args.input_shape else None
    return Job(
        model=args.model, input_shape=shape, gpus=gpus, topology=args.topology,
        algorithm=args.algorithm,
        strategy=args.strategy, device=args.device or "p100", network=args.network or "ib-edr",
        intra=args.intra,
        uplink=args.uplink, oversubscription=args.oversubscription, batch=args.batch,
        bucket_mb=args.bucket_mb, tau=args.tau, overlap=not args.no_overlap,
        compute_time=args.compute_time, efficiency=args.device_efficiency,
        update_time=args.update_time, inter_latency_us=args.inter_latency,
        inter_gbps=args.inter_bandwidth, intra_latency_us=args.intra_latency,
        intra_gbps=args.intra_bandwidth, calibration=args.calibration,
    )


def _input_shape(spec: str) -> tuple[int, ...]:
    """``3x224x224`` as ``(3, 224, 224)``; every dimension a positive integer."""
    try:
        shape = tuple(int(part) for part in spec.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        raise ValueError(f"--input-shape {spec!r} is not positive integers joined by 'x'; "
                         "write it like 3x224x224 (channels x height x width)")
    return shape


def bench_native_fit(
    natives: Sequence[Native], topology: Topology, itemsize: int, model: CostModel
) -> tuple[CostModel, dict[str, Any]]:
    """``scaledl bench collectives --calibrate``'s native fit, for ``simulate calibrate`` (the
    CLI joins the two: the layering rules keep ``sim`` and ``bench`` apart)."""
    from scaledl.bench.fit import _fit_native
    from scaledl.bench.report import Measurement

    measured = [Measurement(n.collective, "native", n.nbytes, n.world_size, (n.median_s,))
                for n in natives]
    return _fit_native(measured, topology, itemsize, model)


def format_result(r: IterationResult) -> str:
    """The lines ``scaledl simulate`` prints for one prediction."""
    return "\n".join([
        f"iteration time       {r.iteration_s * 1e3:10.2f} ms   ({r.samples_per_s:,.0f} "
        f"samples/s on {r.world_size} GPUs)",
        f"  compute            {r.compute_s * 1e3:10.2f} ms   (one GPU: "
        f"{r.single_gpu_s * 1e3:.2f} ms incl. update {r.update_s * 1e3:.2f} ms)",
        f"  communication      {r.communication_s * 1e3:10.2f} ms busy, "
        f"{r.exposed_s * 1e3:.2f} ms exposed",
        f"communication share  {r.communication_share:10.1%}",
        f"scaling efficiency   {r.efficiency:10.1%}",
    ])


def run(args: argparse.Namespace) -> int:
    """Dispatch to prediction, sweep, calibration or validation."""
    if args.action == "calibrate":
        from scaledl.sim.report import run_calibrate

        return run_calibrate(args, job_from_args(args), bench_native_fit)
    if args.action == "reproduce":
        from scaledl.sim.report import run_reproduce

        return run_reproduce()
    if args.action == "validate":
        from scaledl.sim.report import run_validate

        return run_validate(args, job_from_args(args), parse_bytes(args.min_bytes))
    job = job_from_args(args)
    job.check()
    topology, network = job.topology_value(), job.network_value()
    profile = job.profile()
    job.update_seconds(profile)
    head = (f"{job.model} x {job.gpus} {job.device} GPUs, topology {topology.spec}, "
            f"{job.strategy}/{job.algorithm}, network {network.name}, batch {job.batch}/GPU")
    print(head)
    if not args.sweep:
        result = job.run(topology, profile, network)
        print(format_result(result))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            import json

            args.json.write_text(json.dumps({"job": _jsonable(job), "result": result.to_dict()},
                                            indent=2) + "\n")
        return 0
    from scaledl.sim.sweep import run_sweep, scaled_topology, write_sweep_json, write_sweep_plot

    results = run_sweep(topology, lambda topo: job.run(topo, profile, network))
    print(f"{'GPUs':>6} {'topology':>10} {'iter ms':>10} {'comm share':>11} {'efficiency':>11}")
    for r in results:
        spec = scaled_topology(topology, r.world_size).spec
        print(f"{r.world_size:6d} {spec:>10} {r.iteration_s * 1e3:10.2f} "
              f"{r.communication_share:11.1%} {r.efficiency:11.1%}")
    stem = f"simulate-{job.model}-{job.algorithm}-{job.gpus}"
    json_path = args.json or Path(f"{stem}.json")
    plot_path = args.plot or json_path.with_suffix(".png")
    write_sweep_json(results, _jsonable(job), json_path)
    write_sweep_plot(results, head, plot_path)
    print(f"wrote {json_path} and {plot_path}", file=sys.stderr)
    return 0


def _jsonable(job: Job) -> dict[str, Any]:
    data = asdict(job)
    data["calibration"] = str(job.calibration) if job.calibration else None
    return data
