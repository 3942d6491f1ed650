"""Time every aten operation of a few training steps with torch's profiler, per operation and
input shapes: the per-operation data that a roofline with one efficiency per kind of kernel
needs (docs/simulation.md, "Layer by layer on the H100": per-module times cannot separate a
batch norm from the activation after it).

    python benchmarks/device/op_times.py OUTDIR [TAG ...]

TAGs are ``rates.py``'s configurations (default: all), each at its largest batch and with the
same settings (cuDNN autotuning, TF32, or float16 autocast on NHWC images).  Writes
``ops-TAG.json``: the device, the model, batch and precision, the steps profiled, and one row per
(operation, input shapes) with its calls, self device microseconds and self CPU microseconds
over those steps.  A grouped or depthwise convolution is told from a dense one by its shapes
(input channels over the weight's second dimension).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rates import CONFIGS, DEVICE, recipe_settings  # noqa: E402  (this folder is not a package)

from scaledl.models.registry import build_model  # noqa: E402
from scaledl.sim.profile import default_input  # noqa: E402
from scaledl.models.profile import example_input  # noqa: E402

STEPS = int(os.environ.get("OP_STEPS", "3"))
WARMUP = 3


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
          optimizer: torch.optim.Optimizer, amp: bool) -> None:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, torch.float16 if x.is_cuda else torch.bfloat16,
                        enabled=amp):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten())
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def measure(tag: str) -> dict[str, Any]:
    """Profile ``STEPS`` training steps of configuration ``tag`` after ``WARMUP`` untimed ones."""
    name, batches, precision = CONFIGS[tag]
    batch, amp = max(batches), precision == "amp"
    shape, classes = default_input(name)
    shape = (384,) if name == "bert_large" else shape
    target = torch.device(DEVICE)
    model = build_model(name, shape, classes).to(target).train()
    generator = torch.Generator().manual_seed(0)
    x = example_input(model, batch, shape, generator).to(target)
    if amp and x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (batch, *shape) if getattr(model, "token_outputs", False)
                      else (batch,), generator=generator).to(target)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    for _ in range(WARMUP):
        _step(model, x, y, optimizer, amp)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.is_cuda else [])
    if x.is_cuda:
        torch.cuda.synchronize()
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(STEPS):
            _step(model, x, y, optimizer, amp)
        if x.is_cuda:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages(group_by_input_shape=True):
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(event, "self_cuda_time_total", 0.0)
        rows.append({"op": event.key, "shapes": event.input_shapes, "calls": event.count,
                     "self_device_us": float(device_us),
                     "self_cpu_us": float(event.self_cpu_time_total)})
    name_of = torch.cuda.get_device_name(target) if x.is_cuda else "cpu"
    return {"tag": tag, "model": name, "batch": batch, "precision": precision,
            "device": name_of, "torch": torch.__version__, "steps": STEPS, "ops": rows}


def main() -> None:
    out, tags = recipe_settings(sys.argv)
    for tag in [t for t in tags if not t.endswith("-b192")]:  # b192: rates.py's held-out batch
        result = measure(tag)
        (out / f"ops-{tag}.json").write_text(json.dumps(result, indent=1))
        # aten rows only: the profiler also lists each kernel (and record_function ranges)
        # as rows whose device time the aten rows already hold
        key = "self_cpu_us" if result["device"] == "cpu" else "self_device_us"
        total = sum(r[key] for r in result["ops"] if r["op"].startswith("aten::"))
        print(json.dumps({"tag": tag, "ops": len(result["ops"]),
                          "ms_per_step": round(total / 1e3 / STEPS, 2)}), flush=True)


if __name__ == "__main__":
    main()
