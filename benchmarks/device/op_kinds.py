"""Per-operation roofline on a device preset against op_times.py's H100 timings: measured over
roofline per kernel class, and whether one efficiency per class predicts a model left out.

    python benchmarks/device/op_kinds.py [OPS_DIR] [--rates RATES.jsonl] [--device h100]

Defaults: h100-2026-11-26-pm/ops (``ops-TAG.json``) and h100-2026-11-26/rates.jsonl.  Only
``aten::`` rows count (the profiler also lists each kernel, "Command Buffer Full" and the
optimizer's record_function as rows whose device time the aten rows already hold).  A row's
roofline is ``max(FLOPs / peak, bytes / bandwidth)`` at full efficiency (the TF32 peak, or the
FP16 tensor peak for AMP; no Winograd credit, launches or NCHW transposes: ratios absorb them).
FLOPs: convolutions ``2 x output x Cin/groups x kh x kw`` (backward twice, once for the image's
layer), matrix products ``2 m k n``; nothing else.  Bytes, as ``scaledl.models.trace``: every
tensor argument read once, every output written once (element-wise: the largest input; in-place:
the first argument; ``sum``/``mean``: none; ``fill_``: written only; convolution backward:
grad_output, input, weight read, grad_input and grad_weight written), 4 bytes an element at TF32,
2 at AMP except softmax, layer norm, the loss and SGD (float32 under autocast) and ``copy_`` (a
cast, 4 + 2).  SGD's ``_foreach`` rows carry no shapes: they move the model's parameters (mul_:
read and write, add_: two reads and a write); BERT's ``cat`` of a tensor list stays unpriced.

Prints per precision each class's ms per step and measured / roofline per model; device time
against the rates' step time; leave-one-model-out predictions of the step time (classes fitted
on the other three models: ratio of sums or time-weighted median row ratio; one ``e`` fitted the
same way; today's simulator, ``RooflineCompute`` on the preset); and the share of bandwidth that
depthwise convolutions and batch norms reach, by kernel/stride and by channels.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from scaledl.models.registry import build_model
from scaledl.sim.compute import RooflineCompute
from scaledl.sim.presets import Device, device
from scaledl.sim.profile import default_input, profile_model

HERE = Path(__file__).resolve().parent
MIN_SHARE = 0.01
"""A class is fitted on the models where it carries at least this share of the device time."""
KINDS = {
    "elementwise": {"add", "add_", "mul", "mul_", "div", "div_", "sub", "threshold_backward",
                    "clamp_min", "clamp_min_", "relu", "relu_", "silu", "silu_", "silu_backward",
                    "gelu", "gelu_backward", "sigmoid", "sigmoid_backward", "tanh",
                    "tanh_backward", "fill_", "zero_", "native_dropout",
                    "native_dropout_backward", "arange"},
    "softmax": {"_softmax", "_softmax_backward_data", "_log_softmax",
                "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"},
    "norm fwd": {"cudnn_batch_norm", "native_batch_norm", "native_layer_norm"},
    "norm bwd": {"cudnn_batch_norm_backward", "native_batch_norm_backward",
                 "native_layer_norm_backward"},
    "reduce/pool": {"sum", "mean", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
                    "embedding_dense_backward"},
    "copy": {"copy_", "cat", "stack", "gather", "index_select", "clone"},
    "matmul": {"mm", "addmm", "bmm", "baddbmm"},
}
CONV_FORWARD = {"cudnn_convolution", "_conv_depthwise2d", "convolution", "_convolution"}
FLOAT32_UNDER_AMP = KINDS["softmax"] | {"native_layer_norm", "native_layer_norm_backward"}
CLASSES = ("conv dense fwd", "conv dense bwd", "conv grouped fwd", "conv grouped bwd",
           "conv dw fwd", "conv dw bwd", "matmul", "norm fwd", "norm bwd", "elementwise",
           "softmax", "reduce/pool", "copy", "optimizer", "other", "unpriced")
FALLBACK = {"conv dw fwd": "conv grouped fwd", "conv dw bwd": "conv grouped bwd",
            "conv grouped fwd": "conv dense fwd", "conv grouped bwd": "conv dense bwd",
            "conv dense fwd": "matmul", "conv dense bwd": "matmul", "matmul": "conv dense bwd",
            "softmax": "norm fwd", "norm fwd": "elementwise", "norm bwd": "elementwise",
            "reduce/pool": "elementwise", "copy": "elementwise", "optimizer": "elementwise",
            "other": "elementwise"}
"""Where a class that no training model carries borrows its efficiency from."""


@dataclass(frozen=True)
class Op:
    """One (operation, input shapes) row: device seconds, FLOPs and bytes per training step."""

    kind: str
    seconds: float = 0.0
    flops: float = 0.0
    nbytes: float = 0.0
    detail: str = ""
    """Convolutions: ``KxK/stride``; batch norms: their channels, bucketed."""


@dataclass(frozen=True)
class Config:
    tag: str
    model: str
    amp: bool
    batch: int
    ops: tuple[Op, ...]
    cpu_s: float
    """Self CPU seconds per step of the aten rows (inflated by the profiler)."""


def conv(name: str, shapes: list[list[int]], outputs: dict[str, list[int]], size: float) -> Op:
    """A convolution: dense, grouped or depthwise (``Cin / weight.shape[1]`` groups)."""
    backward = name == "convolution_backward"
    x, w = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
    out = shapes[0] if backward else outputs.get(f"{x}{w}", [x[0], w[0], *x[2:]])
    groups = x[1] // w[1]
    group = "dw" if w[1] == 1 and groups > 1 else "grouped" if groups > 1 else "dense"
    flops = 2.0 * math.prod(out) * math.prod(w[1:])
    elems = math.prod(x) + math.prod(w) + math.prod(out)
    if backward:  # grad_input (none for the image) and grad_weight written
        image = x[1] == 3
        flops *= 1 if image else 2
        elems += math.prod(w) + (0 if image else math.prod(x))
    return Op(f"conv {group} {'bwd' if backward else 'fwd'}", 0.0, flops, elems * size,
              f"{w[2]}x{w[3]}/{x[2] // max(out[2], 1)}")


def price(name: str, shapes: list[list[int]], amp: bool, params: int,
          outputs: dict[str, list[int]]) -> Op:
    """One call's class, FLOPs and bytes (see the module docstring)."""
    size = 2.0 if amp and name not in FLOAT32_UNDER_AMP else 4.0
    tensors = [math.prod(s) for s in shapes if s]
    if name in CONV_FORWARD or name == "convolution_backward":
        return conv(name, shapes, outputs, size)
    if name in KINDS["matmul"]:
        a, b = [s for s in shapes if s][-2:]
        m = math.prod(a) // a[-1]
        return Op("matmul", 0.0, 2.0 * m * a[-1] * b[-1], (sum(tensors) + m * b[-1]) * size)
    if name.startswith("_foreach_"):
        return Op("optimizer", nbytes=(2 if name == "_foreach_mul_" else 3) * params * 4.0)
    if not tensors:
        return Op("unpriced")
    kind = next((k for k, names in KINDS.items() if name in names), "other")
    if name == "copy_":
        return Op(kind, nbytes=tensors[0] * (6.0 if amp else 8.0))
    if name in ("fill_", "zero_"):
        elems = tensors[0]
    elif name in ("sum", "mean"):
        elems = sum(tensors)
    else:
        elems = sum(tensors) + (tensors[0] if name.endswith("_") else max(tensors))
    channels = shapes[0][1] if "batch_norm" in name else 0
    bucket = next((f"C<={c}" for c in (32, 64, 128, 256) if channels <= c), "C>256")
    return Op(kind, nbytes=elems * size, detail=bucket if channels else "")


def parameters(model: str) -> int:
    shape, classes = default_input(model)
    with torch.device("meta"):
        net = build_model(model, (384,) if model == "bert_large" else shape, classes)
    return sum(p.numel() for p in net.parameters())


def load(path: Path) -> Config:
    data = json.loads(path.read_text())
    amp, steps = data["precision"] == "amp", data["steps"]
    rows = [r for r in data["ops"] if r["op"].startswith("aten::") and r["self_device_us"] > 0]
    outputs = {f"{r['shapes'][1]}{r['shapes'][2]}": r["shapes"][0]
               for r in rows if r["op"] == "aten::convolution_backward"}
    params, ops = parameters(data["model"]), []
    for r in rows:
        op, calls = price(r["op"][6:], r["shapes"], amp, params, outputs), r["calls"] / steps
        ops.append(replace(op, seconds=r["self_device_us"] / steps / 1e6,
                           flops=op.flops * calls, nbytes=op.nbytes * calls))
    cpu = sum(r["self_cpu_us"] for r in data["ops"] if r["op"].startswith("aten::"))
    return Config(data["tag"], data["model"], amp, data["batch"], tuple(ops), cpu / steps / 1e6)


def roofline(op: Op, dev: Device, amp: bool, e: float = 1.0) -> float:
    peak = (dev.mixed_tflops if amp else dev.peak_tflops) * 1e12 * e
    return max(op.flops / peak, op.nbytes / (dev.memory_gbps * 1e9))


def weighted_median(pairs: Iterable[tuple[float, float]]) -> float:
    """The median of ``(value, weight)`` pairs."""
    ordered = sorted(pairs)
    half, run = sum(w for _, w in ordered) / 2, 0.0
    for value, weight in ordered:
        run += weight
        if run >= half:
            return value
    return math.nan


def fit(configs: Sequence[Config], dev: Device, median: bool) -> dict[str, float]:
    """Measured over roofline per class (ratio of sums, or the time-weighted median row) over
    the configurations where the class carries ``MIN_SHARE`` of the device time."""
    ratios = {}
    for kind in CLASSES[:-1]:
        ops = [(op, c.amp) for c in configs for op in c.ops if op.kind == kind
               and sum(o.seconds for o in c.ops if o.kind == kind)
               >= MIN_SHARE * sum(o.seconds for o in c.ops)]
        pairs = [(op.seconds / r, op.seconds) for op, amp in ops if (r := roofline(op, dev, amp))]
        if pairs:
            ratios[kind] = (weighted_median(pairs) if median else
                            sum(op.seconds for op, _ in ops)
                            / sum(roofline(op, dev, amp) for op, amp in ops))
    return ratios


def predict(config: Config, ratios: dict[str, float], dev: Device) -> dict[str, float]:
    """Device seconds per step by class; a class without a ratio borrows one (``FALLBACK``)."""
    times: dict[str, float] = defaultdict(float)
    for op in config.ops:
        kind, seen = op.kind, set()
        while kind not in ratios and kind in FALLBACK and kind not in seen:
            seen.add(kind)
            kind = FALLBACK[kind]
        times[op.kind] += ratios.get(kind, 0.0) * roofline(op, dev, config.amp)
    return times


def one_e(configs: Sequence[Config], dev: Device) -> float:
    """The single compute efficiency whose roofline sums to the measured device time."""
    measured = sum(op.seconds for c in configs for op in c.ops)
    low, high = 1e-3, 1.0
    for _ in range(60):
        mid = math.sqrt(low * high)
        priced = sum(roofline(op, dev, c.amp, mid) for c in configs for op in c.ops)
        low, high = (mid, high) if priced > measured else (low, mid)
    return high


def step_seconds(rates: Path, tag: str, batch: int) -> float:
    for line in rates.read_text().splitlines():
        rate = json.loads(line)
        if rate["tag"] == tag and rate["batch"] == batch:
            return float(rate["forward_backward_s"] + rate["update_s"])
    return math.nan


def simulated(config: Config, dev: Device) -> float:
    """Today's simulator: the preset's roofline (one ``e``, launches), forward and backward."""
    net = profile_model(config.model, input_shape=(384,) if config.model == "bert_large" else None)
    forward, backward = RooflineCompute(dev, channels_last=config.amp, mixed_precision=config.amp
                                        ).layer_times(net, config.batch)
    return sum(forward) + sum(backward)


def table(configs: Sequence[Config], dev: Device) -> None:
    print(f"{'class':>16} " + " ".join(f"{c.model[:10]:>16}" for c in configs) + "  pooled median")
    pooled, median = fit(configs, dev, False), fit(configs, dev, True)
    for kind in CLASSES:
        cells = []
        for c in configs:
            ops = [op for op in c.ops if op.kind == kind]
            got, roof = sum(op.seconds for op in ops), sum(roofline(op, dev, c.amp) for op in ops)
            cells.append(f"{got * 1e3:8.2f} x{got / roof:6.2f}" if roof else
                         f"{got * 1e3:8.2f} {'-':>7}" if ops else f"{'':16}")
        if any(cell.strip() for cell in cells):
            print(f"{kind:>16} " + " ".join(cells) + f" {pooled.get(kind, math.nan):7.2f}"
                  f" {median.get(kind, math.nan):6.2f}")


def shares(configs: Sequence[Config], dev: Device) -> None:
    """Share of peak bandwidth (bytes / bandwidth / measured; time-weighted median and range) of
    the depthwise convolutions by kernel/stride and the batch norms by channels, per precision;
    for depthwise ones also the FLOP rate reached."""
    groups: dict[tuple[str, str, str], list[Op]] = defaultdict(list)
    for c in configs:
        for op in c.ops:
            if op.kind.startswith("conv dw") or op.detail.startswith("C"):
                groups[("AMP" if c.amp else "TF32", op.kind, op.detail)].append(op)
    order = {d: i for i, d in enumerate(("C<=32", "C<=64", "C<=128", "C<=256", "C>256"))}
    for (precision, kind, detail), ops in sorted(groups.items(), key=lambda g: (
            g[0][0], g[0][1], order.get(g[0][2], 0), g[0][2])):
        pairs = [(op.nbytes / dev.memory_gbps / 1e9 / op.seconds, op.seconds) for op in ops]
        got = sum(op.seconds for op in ops)
        rate = f" {sum(op.flops for op in ops) / got / 1e12:5.1f} TFLOP/s" if "conv" in kind else ""
        print(f"{precision:>4} {kind:>11} {detail:>6} {len(ops):3d} rows {got * 1e3:6.2f} ms "
              f"share {weighted_median(pairs):.2f} ({min(pairs)[0]:.2f}-{max(pairs)[0]:.2f}){rate}")


def error(predicted: float, measured: float) -> str:
    return f"{(predicted / measured - 1) * 100:+5.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("ops", type=Path, nargs="?", default=HERE / "h100-2026-11-26-pm" / "ops")
    parser.add_argument("--rates", type=Path, default=HERE / "h100-2026-11-26" / "rates.jsonl")
    parser.add_argument("--device", default="h100")
    args = parser.parse_args()
    dev = device(args.device)
    configs = sorted((load(p) for p in args.ops.glob("ops-*.json")), key=lambda c: c.model)
    groups = [[c for c in configs if c.amp == amp] for amp in (False, True)]
    for group in groups:
        print(f"\n{'AMP (float16, NHWC)' if group[0].amp else 'TF32 (NCHW)'}: ms per step and "
              f"measured / roofline on {dev.name}; last two: the class fitted on all four")
        table(group, dev)
    print(f"\n{'config':>22} {'batch':>5} {'device ms':>9} {'step ms':>8} {'gap':>6} {'CPU ms':>7}")
    for c in configs:
        got, step = sum(op.seconds for op in c.ops), step_seconds(args.rates, c.tag, c.batch)
        print(f"{c.tag:>22} {c.batch:5d} {got * 1e3:9.2f} {step * 1e3:8.2f} "
              f"{(step / got - 1) * 100:+5.1f}% {c.cpu_s * 1e3:7.1f}")
    print("\nleave one model out: step time predicted (device time only) against the rates'; "
          "misses: pooled, ms")
    print(f"{'config':>22} {'step ms':>7} {'today':>6} {'one e':>13} {'pooled':>6} {'median':>6} "
          f"{'all 4':>6} {'unpriced':>8}  largest misses")
    for group in groups:
        for c in group:
            rest = [o for o in group if o.model != c.model]
            step, e = step_seconds(args.rates, c.tag, c.batch), one_e(rest, dev)
            pooled = predict(c, fit(rest, dev, False), dev)
            misses = sorted(((pooled[k] - sum(op.seconds for op in c.ops if op.kind == k)) * 1e3, k)
                            for k in pooled)
            worst = ", ".join(f"{k} {m:+.1f}" for m, k in sorted(misses, key=lambda m: -abs(m[0]))
                              [:3])
            unpriced = sum(op.seconds for op in c.ops if op.kind == "unpriced") / step
            print(f"{c.tag:>22} {step * 1e3:7.1f} {error(simulated(c, dev), step):>6} "
                  f"{error(sum(roofline(op, dev, c.amp, e) for op in c.ops), step):>6} e={e:.2f} "
                  f"{error(sum(pooled.values()), step):>6} "
                  f"{error(sum(predict(c, fit(rest, dev, True), dev).values()), step):>6} "
                  f"{error(sum(predict(c, fit(group, dev, False), dev).values()), step):>6} "
                  f"{unpriced:8.1%}  {worst}")
    print("\nshare of peak bandwidth: depthwise convolutions, batch norms by channels")
    shares([c for c in configs if c.model != "bert_large"], dev)


if __name__ == "__main__":
    main()
