"""What ``scaledl simulate`` refuses before it runs: output paths it could not write, options
an action would ignore, and a ``--model`` or ``--input-shape`` that a ``--profile`` did not
measure; each one ``ValueError`` naming the option and the fix."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from scaledl.cli.outputs import check_output_file
from scaledl.sim.job import Job
from scaledl.sim.presets import DEVICES, measured_presets

__all__ = ["ACTION_OPTIONS", "LINK_OPTIONS", "check_outputs", "check_sweep_outputs",
           "refuse_unused_options", "check_profile_matches", "input_shape",
           "profile_device"]


LINK_OPTIONS = ("device", "network", "intra", "uplink", "oversubscription", "inter_latency",
                "inter_bandwidth", "intra_latency", "intra_bandwidth", "socket_bandwidth",
                "stack", "cores")
"""The options that make the network a fit starts from or a validation replays on."""

ACTION_OPTIONS = {"reproduce": ("ideal",), "profile": ("model", "input_shape"),
                  "calibrate": LINK_OPTIONS, "validate": (*LINK_OPTIONS, "calibration")}
"""The prediction options an action reads; any other it would ignore, so it is refused."""


def input_shape(spec: str) -> tuple[int, ...]:
    """``3x224x224`` as ``(3, 224, 224)``; every dimension a positive integer."""
    try:
        shape = tuple(int(part) for part in spec.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(size < 1 for size in shape):
        raise ValueError(f"--input-shape {spec!r} is not positive integers joined by 'x'; "
                         "write it like 3x224x224 (channels x height x width)")
    return shape


def check_outputs(args: argparse.Namespace) -> None:
    """One-line errors for output paths, before anything runs or prints."""
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and Path(path).is_dir():
            raise ValueError(f"{flag} {path} is a directory; give a file name such as "
                             f"{Path(path) / ('sweep.json' if flag == '--json' else 'sweep.png')}")
    if args.plot is not None and not args.sweep:
        raise ValueError("--plot draws a sweep; add --sweep (a single prediction has nothing "
                         "to plot)")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            check_output_file(path, flag)


def check_sweep_outputs(json_path: Path, plot_path: Path) -> None:
    """The sweep's JSON and plot must be two files (``--json X.png`` alone would make the
    plot's default path the JSON's)."""
    if json_path.absolute() == plot_path.absolute():
        raise ValueError(f"--json and --plot both name {json_path}; give them different paths "
                         "(the plot defaults to the JSON's name with .png)")
    check_output_file(json_path, "--json")
    check_output_file(plot_path, "--plot")


def refuse_unused_options(args: argparse.Namespace) -> None:
    """An action that does not read a prediction option refuses it, rather than ignore it."""
    keep = ACTION_OPTIONS.get(args.action)
    if keep is None:
        return
    defaults: dict[str, Any] = args.simulate_defaults
    for dest, default in defaults.items():
        if dest in (*keep, "handler", "simulate_defaults", "action"):
            continue
        if getattr(args, dest, default) != default:
            option = "--profile" if dest == "profile_file" else "--" + dest.replace("_", "-")
            reads, only = _ACTION_READS[args.action]
            raise ValueError(f"{option} does not apply to `simulate {args.action}`, which "
                             f"{reads}; drop it ({only})")


_ACTION_READS = {
    "reproduce": ("predicts each published point with that job's own settings",
                  "only --ideal applies"),
    "profile": ("measures a model on this machine",
                "only --model and --input-shape apply before `profile`; its own options, "
                "--mixed-precision and --channels-last among them, go after it"),
    "calibrate": ("fits links to collective measurements, not a training job",
                  "the device, network and link options apply"),
    "validate": ("replays collective measurements, not a training job",
                 "the device, network, link and --calibration options apply"),
}


def profile_device(profile_file: Path | None) -> str | None:
    """``--device``'s default beside ``--profile``: the preset of the device the profile was
    measured on (``cpu``, or the most specific GPU preset that names its GPU); None without a
    profile.  ``ValueError`` for a GPU that no preset names, asking for ``--device``."""
    measured = None if profile_file is None else Job(profile_path=profile_file).measured()
    if measured is None:
        return None
    named = measured_presets(measured)
    if not named:
        gpus = ", ".join(name for name, dev in DEVICES.items() if dev.is_gpu)
        raise ValueError(f"the profile {profile_file} was measured on "
                         f"{measured.device.get('name', 'a GPU')}, which no device preset "
                         f"names; give --device with the closest of {gpus}")
    return named[0]


def check_profile_matches(args: argparse.Namespace, job: Job) -> Job:
    """``--model`` or ``--input-shape`` beside ``--profile`` must name what the profile
    measured: the profile's model and shape are the ones predicted, never silently another.
    Returns ``job`` naming them (its published check and ``--json`` then say the profile's
    model, not the default)."""
    measured = job.measured()
    if measured is None:
        return job
    if args.model is not None and args.model.lower() != measured.model.lower():
        raise ValueError(f"--model {args.model} but the profile {job.profile_path} measured "
                         f"{measured.model}; drop --model (the profile's model is used) or "
                         f"profile {args.model} (`scaledl simulate profile --model {args.model}`)")
    if job.input_shape is not None and tuple(job.input_shape) != tuple(measured.input_shape):
        shape = "x".join(map(str, measured.input_shape))
        raise ValueError(f"--input-shape {args.input_shape} but the profile {job.profile_path} "
                         f"measured {shape}; drop --input-shape or profile that shape")
    return replace(job, model=measured.model, input_shape=tuple(measured.input_shape))
