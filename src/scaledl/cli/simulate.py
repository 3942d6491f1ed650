"""``scaledl simulate``: predict training time at 8..1024 GPUs from replayed collective plans.

``scaledl simulate --model resnet50 --gpus 256 --topology 4x16x4 --algorithm torus --device p100
--network ib-edr`` prints the iteration time, the communication share and the scaling
efficiency; ``--sweep`` runs 1, 2, 4, ... GPUs and writes a JSON and a PNG; ``--ideal`` drops
every loss term (the optimistic model of earlier releases); ``--profile FILE`` uses per-layer
times measured by ``scaledl simulate profile``.  ``scaledl simulate calibrate BENCH.json ...``
fits the link classes to ``scaledl bench collectives --json`` output; ``scaledl simulate
validate BENCH.json --calibration FILE`` prints predicted against measured times;
``scaledl simulate reproduce`` prints the published results beside the predictions.  What is
printed is in :mod:`scaledl.cli.simulate_report`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scaledl.cli.bench_collectives import parse_bytes
from scaledl.cli.simulate_checks import (
    check_outputs,
    check_profile_matches,
    profile_device,
    check_sweep_outputs,
    input_shape,
    refuse_unused_options,
)
from scaledl.cli.simulate_profile import add_profile_parser
from scaledl.collectives.registry import ALGORITHMS
from scaledl.files import write_files
from scaledl.models.registry import available_models
from scaledl.sim.iteration import simulated_strategies
from scaledl.sim.job import Job, JobError
from scaledl.sim.scenario import job_network, job_profile, resolve
from scaledl.sim.losses import STACKS
from scaledl.sim.presets import ALIASES, DEVICES, LINKS

__all__ = ["add_parser", "run", "job_from_args"]


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help=f"one of {', '.join(available_models())} (default: resnet50, or the "
                        "model of --profile)")
    p.add_argument("--input-shape", default=None,
                   help="sample shape such as 3x224x224 (default: ImageNet or the model's own)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs (default: the topology's product)")
    p.add_argument("--topology", default=None,
                   help="axes innermost first, e.g. 4x16x4 = 4 GPUs per host, 16 hosts per "
                        "rack, 4 racks (default 4 per host)")
    p.add_argument("--algorithm", default=None,
                   help="collective algorithm (default: ring; tree for reduce-broadcast): "
                        + ", ".join(a for a, algo in ALGORITHMS.items() if algo.scheduled))
    p.add_argument("--strategy", default="allreduce", choices=simulated_strategies())
    p.add_argument("--device", default=None,
                   help=f"one of {', '.join(DEVICES)} (default: a --profile's, else p100)")
    p.add_argument("--network", default=None,
                   help=f"inter-host link: {', '.join([*LINKS, *ALIASES])} (default ib-edr)")
    p.add_argument("--intra", default=None, help="intra-host link preset (default: the device's)")
    p.add_argument("--uplink", default=None, help="rack uplink preset (default: --network)")
    p.add_argument("--oversubscription", type=float, default=1.0,
                   help="rack uplink oversubscription (1 = non-blocking)")
    p.add_argument("--batch", type=int, default=32, help="samples per GPU per iteration")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size, MiB")
    p.add_argument("--tau", type=int, default=1, help="EASGD: exchange every tau steps")
    p.add_argument("--allreduce-dtype", choices=("float32", "float16", "bfloat16"),
                   default="float32",
                   help="gradients on the wire: float16/bfloat16 halve the bytes (DDP's "
                        "fp16 compression hook, Horovod's Compression.fp16)")
    p.add_argument("--accumulation", type=int, default=1, metavar="N",
                   help="micro-batches of --batch per optimizer step (gradient accumulation: "
                        "one allreduce after the last); the iteration is the whole step, and "
                        "--compute-time one micro-batch's")
    p.add_argument("--channels-last", action="store_true",
                   help="the model runs on NHWC tensors (torch.channels_last): no transposes "
                        "around convolutions on tensor-core presets ("
                        f"{', '.join(n for n, d in DEVICES.items() if d.nhwc_convolutions)}; "
                        "with --mixed-precision also the others that have it); no effect "
                        "elsewhere")
    p.add_argument("--mixed-precision", action="store_true",
                   help="FP16/BF16 compute on tensor cores (autocast, amp) at the device's "
                        "mixed-precision peak ("
                        f"{', '.join(n for n, d in DEVICES.items() if d.mixed_tflops > 0)})")
    p.add_argument("--no-overlap", action="store_true",
                   help="communicate after backward (allreduce) / after compute (sync-easgd)")
    p.add_argument("--compute-time", type=float, default=None,
                   help="measured forward+backward seconds of one --batch on one GPU (per "
                        "micro-batch with --accumulation)")
    p.add_argument("--device-efficiency", type=float, default=None,
                   help="fraction of the device's peak FLOP/s training achieves (of its "
                        "mixed-precision peak with --mixed-precision)")
    p.add_argument("--update-time", type=float, default=None, help="optimizer step, seconds")
    p.add_argument("--input-rate", type=float, default=None, metavar="SAMPLES_PER_S",
                   help="samples/s one host's input pipeline delivers (time the data loader "
                        "alone); an iteration waits for it when the GPUs are faster")
    p.add_argument("--inter-latency", type=float, default=None, help="override, microseconds")
    p.add_argument("--inter-bandwidth", type=float, default=None,
                   help="override of the link's rate, GB/s (a stack's measured share of a "
                        "link, tf-replicated's, still applies)")
    p.add_argument("--intra-latency", type=float, default=None, help="override, microseconds")
    p.add_argument("--intra-bandwidth", type=float, default=None,
                   help="override of the link's rate, GB/s (as --inter-bandwidth)")
    p.add_argument("--socket-bandwidth", type=float, default=None, metavar="GBPS",
                   help="GB/s one host thread moves through a TCP socket at each end, where "
                        "bytes cross hosts on Ethernet without RDMA (NCCL's socket transport; "
                        "default: the device preset's, 2.06 on GPU hosts); measure yours with "
                        "nccl-tests and NCCL_IB_DISABLE=1")
    p.add_argument("--calibration", type=Path, default=None,
                   help="links from `scaledl simulate calibrate` instead of presets")
    p.add_argument("--profile", type=Path, default=None, dest="profile_file",
                   help="per-layer times measured by `scaledl simulate profile` (instead of "
                        "FLOPs; its model and input shape win)")
    p.add_argument("--stack", default=None, choices=list(STACKS),
                   help="software stack: per-call and per-tensor costs, Horovod's cycle "
                        "(default: scaledl on --device cpu, mpi on knl, nccl on GPUs)")
    p.add_argument("--cycle-ms", type=float, default=None,
                   help="Horovod's negotiation cycle, ms (HOROVOD_CYCLE_TIME; default: the "
                        "stack's, 5 for horovod, 1 for horovod-0.21)")
    p.add_argument("--fusion-mb", type=float, default=None,
                   help="Horovod's fusion buffer, MiB (HOROVOD_FUSION_THRESHOLD; default: the "
                        "stack's, 64 for horovod, 128 for horovod-0.21)")
    p.add_argument("--cores", type=int, default=None,
                   help="CPU cores every rank shares (one machine emulating the cluster, "
                        "`scaledl cluster`): shared-memory stages slow by ranks / cores, "
                        "compute and the update by that and the device's time-sharing loss; a "
                        "collective round's TCP and reduction work shares the cores with the "
                        "other ranks' rounds; with twice as many cores as ranks the scaledl "
                        "stack's per-call cost is none (without --cores it is paid)")
    p.add_argument("--ideal", action="store_true",
                   help="the optimistic model: constant device efficiency, no stragglers, "
                        "interference, software costs or host CPU limits")
    p.add_argument("--sweep", action="store_true", help="simulate 1, 2, 4, ... GPUs up to --gpus")
    p.add_argument("--json", type=Path, default=None, help="write results as JSON (a file)")
    p.add_argument("--plot", type=Path, default=None,
                   help="with --sweep: the plot's PNG file (default: beside the JSON)")


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
    val.add_argument("--tolerance", type=float, default=0.15,
                     help="relative error counted as a match (default 0.15)")
    rep = actions.add_parser("reproduce", help="published results beside predictions, with errors")
    rep.add_argument("--write-errors", type=Path, default=None, metavar="FILE",
                     help="also write each efficiency point's error and traits, the data behind "
                          "a prediction's published check (maintainers: the package's "
                          "src/scaledl/sim/published_errors.json)")
    add_profile_parser(actions)
    p.set_defaults(handler=run)
    p.set_defaults(simulate_defaults=vars(p.parse_args([])))


DEFAULT_ALGORITHMS = {"reduce-broadcast": "tree"}
"""A strategy's algorithm when ``--algorithm`` is not given (else ring): reduce-broadcast
reduces to a root, which a ring does not do (S-Caffe's reduction tree)."""

def job_from_args(args: argparse.Namespace) -> Job:
    """The :class:`Job` the options describe."""
    gpus = args.gpus
    if gpus is None:
        from scaledl.topology import parse_axes
        import math

        gpus = math.prod(parse_axes(args.topology)) if args.topology is not None else 8
    if gpus < 1:
        raise ValueError(f"--gpus {gpus} must be >= 1")
    if args.batch < 1:
        raise ValueError(f"--batch {args.batch} must be >= 1")
    shape = input_shape(args.input_shape) if args.input_shape else None
    return Job(
        model=args.model or "resnet50", input_shape=shape, gpus=gpus, topology=args.topology,
        algorithm=args.algorithm or DEFAULT_ALGORITHMS.get(args.strategy, "ring"),
        strategy=args.strategy,
        device=args.device or profile_device(args.profile_file) or "p100",
        network=args.network or "ib-edr",
        intra=args.intra,
        uplink=args.uplink, oversubscription=args.oversubscription, batch=args.batch,
        bucket_mb=args.bucket_mb, tau=args.tau, overlap=not args.no_overlap,
        compute_time=args.compute_time, efficiency=args.device_efficiency,
        update_time=args.update_time, inter_latency_us=args.inter_latency,
        inter_gbps=args.inter_bandwidth, intra_latency_us=args.intra_latency,
        intra_gbps=args.intra_bandwidth, socket_gbps=args.socket_bandwidth,
        calibration=args.calibration, lossless=args.ideal,
        stack=args.stack, profile_path=args.profile_file, cores=args.cores,
        input_rate=args.input_rate, cycle_ms=args.cycle_ms, fusion_mb=args.fusion_mb,
        accumulation=args.accumulation, channels_last=args.channels_last,
        mixed_precision=args.mixed_precision,
        allreduce_bytes=4 if args.allreduce_dtype == "float32" else 2,
    )


def _units(job: Job) -> str:
    """What the job's ranks run on: GPUs, or ranks of a CPU preset (cpu, knl)."""
    from scaledl.cli.simulate_report import units_of

    return units_of(job)


def _micro(steps: int) -> str:
    """The header's note of gradient accumulation (nothing without it)."""
    return f" x {steps} micro-batches per step" if steps > 1 else ""


FLAGS = {
    "accumulation": "--accumulation", "algorithm": "--algorithm",
    "allreduce_bytes": "--allreduce-dtype", "bucket_mb": "--bucket-mb",
    "calibration": "--calibration", "channels_last": "--channels-last",
    "compute_time": "--compute-time", "cores": "--cores", "cycle_ms": "--cycle-ms",
    "device": "--device", "efficiency": "--device-efficiency", "fusion_mb": "--fusion-mb",
    "gpus": "--gpus", "lossless": "--ideal", "input_rate": "--input-rate",
    "input_shape": "--input-shape", "inter_gbps": "--inter-bandwidth",
    "inter_latency_us": "--inter-latency", "intra": "--intra", "intra_gbps": "--intra-bandwidth",
    "intra_latency_us": "--intra-latency", "mixed_precision": "--mixed-precision",
    "model": "--model", "network": "--network", "overlap": "--no-overlap",
    "oversubscription": "--oversubscription", "profile_path": "--profile",
    "socket_gbps": "--socket-bandwidth", "stack": "--stack", "strategy": "--strategy",
    "tau": "--tau", "topology": "--topology", "update_time": "--update-time",
    "uplink": "--uplink", "batch": "--batch",
}
"""The option that sets each :class:`~scaledl.sim.job.Job` field, as a job's errors name them
here."""


def run(args: argparse.Namespace) -> int:
    """Dispatch to prediction, sweep, calibration, validation, reproduction or profiling; a
    job's errors name the options that set its fields."""
    try:
        return _run(args)
    except JobError as error:
        raise ValueError(error.named(FLAGS)) from None


def _run(args: argparse.Namespace) -> int:
    """:func:`run` before a job's errors are named by option."""
    from scaledl.cli import simulate_report as report
    from scaledl.cli import simulate_warnings as warnings

    refuse_unused_options(args)
    if args.action == "profile":
        from scaledl.cli.simulate_profile import run_profile

        return run_profile(args, input_shape)
    if args.action == "reproduce":
        return report.run_reproduce(args.ideal, args.write_errors)
    if args.action == "calibrate":
        return report.run_calibrate(args, job_from_args(args))
    if args.action == "validate":
        return report.run_validate(args, job_from_args(args), parse_bytes(args.min_bytes))
    check_outputs(args)
    job = job_from_args(args)
    job.check()
    job = check_profile_matches(args, job)
    measured = job.measured()
    if measured is not None and job.profile_path is not None:
        warnings.warn_on_busy_profile(measured, Path(job.profile_path))
        warnings.warn_on_unmeasured_batch(job, measured)
        warnings.warn_on_threaded_profile(job, measured)
    topology, network = job.topology_value(), job_network(job)
    warnings.warn_on_one_host_oversubscription(job, topology)
    profile = job_profile(job)  # a malformed model or shape is the one line before any warning
    warnings.warn_on_unchecked_compute(job)
    scenario = resolve(job, topology=topology, network=network, profile=profile)
    model = "ideal model" if job.lossless else f"stack {scenario.losses.stack.name}"
    source = f", profile {job.profile_path}" if job.profile_path else ""
    mixed, nhwc = (measured.mixed_precision, measured.channels_last) if measured else (False, False)
    sockets = (f" (TCP sockets {1e-9 / network.cpu_beta:.2f} GB/s per thread)"
               if network.cpu_beta > 0 and not network.tcp_inside else "")
    head = (f"{profile.name} x {report.counted(job.gpus, _units(job), job.device)}, "
            f"topology {topology.spec}, "
            f"{job.strategy}/{job.algorithm}, network {network.name}{sockets}, "
            f"batch {job.batch}/{_units(job)[:-1]}{_micro(job.accumulation)}"
            f"{', channels last' if job.channels_last or nhwc else ''}"
            f"{', mixed precision' if job.mixed_precision or mixed else ''}, {model}{source}")
    if not args.sweep:
        result = scenario.run()
        lines, check = report.published_check(job, result.efficiency)
        if args.json:
            import json

            data = {"job": scenario.record(), "result": result.to_dict(),
                    "published_check": check}
            write_files([(args.json, lambda path: path.write_text(
                json.dumps(data, indent=2) + "\n"))])
        print(head)
        print(report.format_result(result, _units(job)))
        if lines:
            print(lines)
        return 0
    from scaledl.sim.sweep import run_sweep, sweep_topologies, write_sweep_json, write_sweep_plot

    stem = f"simulate-{profile.name}-{job.algorithm}-{job.gpus}"
    json_path = args.json or Path(f"{stem}.json")
    plot_path = args.plot or json_path.with_suffix(".png")
    check_sweep_outputs(json_path, plot_path)
    results = run_sweep(topology, scenario.run)
    units = _units(job)
    lines, check = report.published_check(job, results[-1].efficiency,
                                          f"the {job.gpus}-{units[:-1]} job")
    record = scenario.record()
    write_files([(json_path, lambda path: write_sweep_json(results, record, path, check)),
                   (plot_path, lambda path: write_sweep_plot(results, head, path, units))])
    print(head)
    print(report.format_sweep(results, [t.spec for t in sweep_topologies(topology)], units))
    if lines:
        print(lines)
    print(f"wrote {json_path} and {plot_path}", file=sys.stderr)
    return 0


