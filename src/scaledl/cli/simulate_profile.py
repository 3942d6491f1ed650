"""``scaledl simulate profile``: measure a model on this device and write a profile file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any
from pathlib import Path

from scaledl.cli.outputs import check_output_file
from scaledl.models.registry import available_models

__all__ = ["add_profile_parser", "run_profile"]


def add_profile_parser(actions: Any) -> None:
    """The ``profile`` subcommand's options, under ``scaledl simulate``."""
    prof = actions.add_parser(
        "profile", help="measure a model's per-layer times on this device and write a profile",
        description="Measure per-layer forward and backward times (hooks), the whole "
                    "iteration, the update, memory, jitter, interference and TCP cost on the "
                    "local device; `scaledl simulate --profile FILE` then uses them.")
    prof.add_argument("--model", dest="p_model", default=None,
                      help=f"one of {', '.join(available_models())} (default: simulate's --model)")
    prof.add_argument("--input-shape", dest="p_input_shape", default=None,
                      help="sample shape such as 3x32x32 (default: ImageNet or the model's own)")
    prof.add_argument("--classes", type=int, default=None, help="output classes (default: "
                      "1000 for ImageNet models, else 10)")
    prof.add_argument("--batches", default="8,32", help="batch sizes, comma-separated")
    prof.add_argument("--repeats", type=int, default=5, help="timed iterations per batch (>= 3)")
    prof.add_argument("--warmup", type=int, default=2, help="untimed iterations per batch")
    prof.add_argument("--on", dest="on_device", default=None,
                      help="device to measure: cpu, cuda or cuda:N (default: cuda if "
                           "available, else cpu)")
    prof.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    prof.add_argument("--channels-last", dest="p_channels_last", action="store_true",
                      help="measure the model on NHWC tensors (torch.channels_last; "
                           "simulate's own --channels-last does the same)")
    prof.add_argument("--mixed-precision", dest="p_mixed_precision", action="store_true",
                      help="measure the forward pass under autocast (float16 on CUDA, "
                           "bfloat16 on a CPU; simulate's own --mixed-precision does the same)")
    prof.add_argument("-o", "--output", type=Path, default=None,
                      help="profile file (default profile-<model>.json)")


def run_profile(args: argparse.Namespace, parse_shape: Callable[[str], tuple[int, ...]]) -> int:
    """``scaledl simulate profile``: measure, write, summarise."""
    import torch

    from scaledl.cli.simulate_report import format_profile
    from scaledl.profiling.measure import measurable_device, measure_profile
    from scaledl.sim.profile import default_input
    from scaledl.profiling.profile_file import save_profile
    from scaledl.cli.simulate_warnings import warn_on_busy_profile

    _refuse_twice(args)
    model = (args.p_model or args.model or "resnet50").lower()
    if model not in available_models():
        raise ValueError(f"unknown model {args.p_model or args.model!r}; available: "
                         f"{', '.join(available_models())}")
    shape, classes = default_input(model)
    spec = args.p_input_shape or args.input_shape
    shape = parse_shape(spec) if spec else shape
    classes = args.classes if args.classes is not None else classes
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise ValueError(f"--batches {args.batches!r} must be positive integers joined by "
                         "commas, e.g. 8,32")
    if args.repeats < 3 or args.warmup < 0 or classes < 1:
        raise ValueError(f"--repeats {args.repeats} must be >= 3, --warmup {args.warmup} >= 0 "
                         f"and --classes {classes} >= 1")
    on = str(measurable_device(args.on_device, "--on"))
    output = _output_path(args.output, model)
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    measured = measure_profile(model, shape, classes, batches, args.repeats, args.warmup, on,
                               args.p_channels_last,
                               args.p_mixed_precision)
    save_profile(measured, output)
    print(format_profile(measured, output))
    warn_on_busy_profile(measured, output)
    return 0


def _refuse_twice(args: argparse.Namespace) -> None:
    """``--model`` (``--input-shape``) both before and after ``profile`` must agree: one of
    the two would otherwise be ignored."""
    for flag, before, after in (("--model", args.model, args.p_model),
                                ("--input-shape", args.input_shape, args.p_input_shape)):
        if before is not None and after is not None and before.lower() != after.lower():
            raise ValueError(f"{flag} {before} before `profile` and {flag} {after} after it "
                             f"name different values; give {flag} once")


def _output_path(given: Path | None, model: str) -> Path:
    """``-o`` (or ``profile-<model>.json``) once the profile can be written there: checked
    before anything is measured."""
    output = given or Path(f"profile-{model}.json")
    if output.is_dir():
        raise ValueError(f"-o {output} is a directory; give a file name such as "
                         f"{output / f'profile-{model}.json'}")
    return check_output_file(output, "-o")
