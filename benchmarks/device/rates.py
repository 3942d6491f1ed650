"""Measure single-GPU training steps of scaledl's models with ``scaledl.profiling.measure`` under
the settings NVIDIA's recipes use (cuDNN autotuning, TF32 matrix products), one profile file each.

    python benchmarks/device/rates.py OUTDIR [TAG ...]

Each configuration is a model, a batch list, and a precision (``tf32``: float32 tensors with
TF32 convolutions and matrix products; ``amp``: float16 autocast on NHWC tensors for images).
The profile files are what ``scaledl simulate --profile`` reads; one line per batch is printed
with the measured samples/s.  docs/simulation.md, "Device efficiency", compares them with the
device presets.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import os

import torch

from scaledl.profiling.measure import measure_profile
from scaledl.sim.profile import default_input
from scaledl.profiling.profile_file import save_profile

DEVICE = os.environ.get("RATES_DEVICE", "cuda")  # cpu: a dry run
CONFIGS = {  # tag: model, batches, precision
    "resnet50-tf32": ("resnet50", (64, 128, 256), "tf32"),
    "resnet50-tf32-b192": ("resnet50", (192,), "tf32"),
    "resnet50-amp": ("resnet50", (128, 256), "amp"),
    "resnext101-tf32": ("resnext101_32x4d", (128,), "tf32"),
    "resnext101-amp": ("resnext101_32x4d", (128,), "amp"),
    "efficientnet_b0-tf32": ("efficientnet_b0", (256,), "tf32"),
    "efficientnet_b0-amp": ("efficientnet_b0", (256,), "amp"),
    "bert_large-tf32": ("bert_large", (32,), "tf32"),
    "bert_large-amp": ("bert_large", (32,), "amp"),
}


def recipe_settings(argv: list[str]) -> tuple[Path, list[str]]:
    """NVIDIA's recipes' settings (cuDNN autotuning, TF32 convolutions and matrix products);
    the output folder (created) and the tags ``argv`` names, all by default."""
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    return out, argv[2:] or list(CONFIGS)


def main() -> None:
    out, tags = recipe_settings(sys.argv)
    for tag in tags:
        model, batches, precision = CONFIGS[tag]
        shape, classes = default_input(model)
        if model == "bert_large":
            shape = (384,)  # SQuAD's sequence length, as the published BERT rates
        amp = precision == "amp"
        start = time.perf_counter()
        profile = measure_profile(model, shape, classes, list(batches), repeats=10, warmup=3,
                                  device=DEVICE, channels_last=amp and len(shape) == 3,
                                  mixed_precision=amp)
        save_profile(profile, out / f"rate-{tag}.json")
        for batch, fb, up in zip(profile.batches, profile.forward_backward_s, profile.update_s):
            print(json.dumps({"tag": tag, "model": model, "precision": precision,
                              "batch": batch, "forward_backward_s": fb, "update_s": up,
                              "samples_per_s": batch / (fb + up),
                              "measured_in_s": round(time.perf_counter() - start, 1)}),
                  flush=True)


if __name__ == "__main__":
    main()
