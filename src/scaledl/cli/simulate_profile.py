"""``scaledl simulate profile``: measure a model on this device and write a profile file."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from scaledl.models.registry import available_models

__all__ = ["run_profile"]


def run_profile(args: argparse.Namespace, parse_shape: Callable[[str], tuple[int, ...]]) -> int:
    """``scaledl simulate profile``: measure, write, summarise."""
    import torch

    from scaledl.cli.simulate_report import format_profile
    from scaledl.sim.measure import measure_profile
    from scaledl.sim.profile import default_input
    from scaledl.sim.profile_file import save_profile

    model = (args.p_model or args.model).lower()
    if model not in available_models():
        raise ValueError(f"unknown model {args.p_model!r}; available: "
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
    on = args.on_device or ("cuda" if torch.cuda.is_available() else "cpu")
    if on.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--on {on}: no CUDA device here; use --on cpu")
    output = args.output or Path(f"profile-{model}.json")
    if output.is_dir():
        raise ValueError(f"-o {output} is a directory; give a file name such as "
                         f"{output / f'profile-{model}.json'}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    measured = measure_profile(model, shape, classes, batches, args.repeats, args.warmup, on,
                               args.p_channels_last or args.channels_last)
    save_profile(measured, output)
    print(format_profile(measured, output))
    return 0
