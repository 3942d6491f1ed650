"""Where a device preset's roofline errs, layer kind by layer kind, against a measured profile.

    python benchmarks/device/layer_kinds.py PROFILE.json BATCH [--device h100]

Each layer that owns parameters (with the parameterless operations after it, as ``scaledl
simulate --profile`` charges them) is grouped by kind: dense convolutions by kernel and stride,
grouped and depthwise convolutions, and every other module type.  For each kind it prints the
measured forward + backward milliseconds, the roofline's, and their ratio, with and without the
Winograd credit for 3x3 stride-1 convolutions.  Mixed precision and NHWC are read from the
profile.  docs/simulation.md, "Device efficiency", quotes its output for the H100 profiles in
benchmarks/device/h100-2026-11-26.
"""

from __future__ import annotations

import argparse
import collections
from dataclasses import replace
from pathlib import Path

from torch import nn

from scaledl.models.registry import build_model
from scaledl.profiling.profile_file import load_profile
from scaledl.sim.compute import RooflineCompute, measured_compute
from scaledl.sim.presets import device
from scaledl.sim.profile import ModelProfile, profile_model


def kind(module: nn.Module) -> str:
    """A layer's kind: ``3x3/1`` (kernel/stride), ``grouped 3x3``, ``depthwise``, or the type."""
    if not isinstance(module, nn.Conv2d):
        return type(module).__name__
    size = "x".join(map(str, module.kernel_size))
    if module.groups > 1:
        return "depthwise" if module.groups == module.in_channels else f"grouped {size}"
    return f"{size}/{module.stride[0]}"


def without_winograd(profile: ModelProfile) -> ModelProfile:
    """The same layers with no operation marked as a Winograd convolution."""
    layers = tuple(replace(layer, winograd=False,
                           ops=tuple(replace(op, winograd=False) for op in layer.ops))
                   for layer in profile.layers)
    return replace(profile, layers=layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("batch", type=int)
    parser.add_argument("--device", default="h100")
    args = parser.parse_args()
    measured = load_profile(args.profile)
    mixed = measured.device.get("precision", "float32") != "float32"
    nhwc = measured.device.get("memory_format") == "channels_last"
    profile = profile_model(measured.model, input_shape=measured.input_shape,
                            num_classes=measured.num_classes)
    times = measured_compute(measured, profile).layer_times(profile, args.batch)
    roofline = RooflineCompute(device(args.device), channels_last=nhwc, mixed_precision=mixed)
    credited = roofline.layer_times(profile, args.batch)
    plain = roofline.layer_times(without_winograd(profile), args.batch)
    modules = dict(build_model(measured.model, measured.input_shape,
                               measured.num_classes).named_modules())
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for i, layer in enumerate(profile.layers):
        row = rows[kind(modules[layer.name])]
        for j, (forward, backward) in enumerate((times, credited, plain)):
            row[j] += (forward[i] + backward[i]) * 1e3
        row[3] += 1
    print(f"{measured.model} at batch {args.batch} on {measured.device.get('name')} "
          f"({'float16 autocast' if mixed else 'float32/TF32'}, {'NHWC' if nhwc else 'NCHW'}) "
          f"against the {args.device} preset; ms of forward + backward")
    print(f"{'kind':>14} {'layers':>6} {'measured':>9} {'roofline':>9} {'ratio':>6} "
          f"{'no Winograd':>12} {'ratio':>6}")
    for name, (got, with_credit, without, count) in sorted(rows.items(), key=lambda r: -r[1][0]):
        print(f"{name:>14} {int(count):6d} {got:9.2f} {with_credit:9.2f} {got / with_credit:6.2f} "
              f"{without:12.2f} {got / without:6.2f}")
    total = [sum(r[j] for r in rows.values()) for j in range(3)]
    print(f"{'all':>14} {len(profile.layers):6d} {total[0]:9.2f} {total[1]:9.2f} "
          f"{total[0] / total[1]:6.2f} {total[2]:12.2f} {total[0] / total[2]:6.2f}")


if __name__ == "__main__":
    main()
