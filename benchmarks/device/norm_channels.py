"""cuDNN's NCHW batch norm at TF32, by channels, on every GPU with op_times.py files: the bandwidth
each (direction, channels) reaches, and whether ``min(C k, s B)`` fitted on the ResNets of one
GPU predicts EfficientNet's batch norms there and every model's on the others.

    python benchmarks/device/norm_channels.py [--fit h100]

``k`` is a rate per channel (the median of bytes / seconds / C over layers of 128 channels or
fewer), ``s`` a share of the GPU's peak bandwidth ``B`` (the median over 512 channels or more),
one pair per direction. Bytes as ``op_kinds.py`` prices them (every tensor argument read, the
largest written; float32). The finding (docs/simulation.md, "Device efficiency"): below about 200
channels a batch norm's bandwidth grows with its channels at the same rate per channel on the
H100 and the H200, whatever their memory, as if each channel were one block of threads with a
fixed streaming rate; wider ones reach about half the peak.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from op_kinds import price  # noqa: E402  (this folder is not a package)

from scaledl.sim.presets import device  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = {"h100": HERE / "h100-2026-11-26-pm" / "ops", "h200": HERE / "h200-2026-11-26" / "ops"}
MODELS = ("resnet50", "resnext101", "efficientnet_b0")
FIT_ON = ("resnet50", "resnext101")
NORMS = ("cudnn_batch_norm", "cudnn_batch_norm_backward")
NARROW, WIDE = 128, 512
"""Channels at or below which ``k`` is fitted, and at or above which ``s`` is."""

Row = tuple[str, int, float, float]
"""Direction (fwd, bwd), channels, bytes and device seconds per step."""


def norm_rows(path: Path) -> list[Row]:
    """The cuDNN batch-norm rows of one ``ops-TAG.json``, per step."""
    data = json.loads(path.read_text())
    rows = []
    for r in data["ops"]:
        name = r["op"].removeprefix("aten::")
        if name not in NORMS or r["self_device_us"] <= 0:
            continue
        per_step = r["calls"] / data["steps"]
        nbytes = price(name, r["shapes"], False, 0, {}).nbytes * per_step
        rows.append(("bwd" if name.endswith("backward") else "fwd", r["shapes"][0][1], nbytes,
                     r["self_device_us"] / data["steps"] / 1e6))
    return rows


def fit(rows: list[Row], peak: float) -> dict[str, tuple[float, float]]:
    """Per direction, ``k`` (bytes/s per channel) and ``s`` (share of ``peak``)."""
    fitted = {}
    for direction in ("fwd", "bwd"):
        mine = [r for r in rows if r[0] == direction]
        k = statistics.median(b / t / c for _, c, b, t in mine if c <= NARROW)
        s = statistics.median(b / t / peak for _, c, b, t in mine if c >= WIDE)
        fitted[direction] = (k, s)
    return fitted


def predicted(rows: list[Row], fitted: dict[str, tuple[float, float]], peak: float) -> float:
    """Seconds per step of ``rows`` at ``min(C k, s peak)`` bytes/s."""
    return sum(b / min(c * fitted[d][0], fitted[d][1] * peak) for d, c, b, _ in rows)


def all_rows() -> dict[tuple[str, str], list[Row]]:
    """Every (GPU, model)'s TF32 batch-norm rows."""
    return {(gpu, m): norm_rows(RUNS[gpu] / f"ops-{m}-tf32.json") for gpu in RUNS for m in MODELS}


def peak(gpu: str) -> float:
    """The preset's peak memory bandwidth, bytes/s."""
    return device(gpu).memory_gbps * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fit", default="h100", choices=sorted(RUNS))
    args = parser.parse_args()
    rows = all_rows()
    peaks = {gpu: peak(gpu) for gpu in RUNS}
    print("GB/s reached per (direction, channels), all models' rows together")
    for gpu in RUNS:
        by: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for m in MODELS:
            for d, c, b, t in rows[(gpu, m)]:
                by[(d, c)][0] += b
                by[(d, c)][1] += t
        for direction in ("fwd", "bwd"):
            cells = " ".join(f"{c}:{b / t / 1e9:.0f}" for (d, c), (b, t) in sorted(by.items())
                             if d == direction)
            print(f"{gpu} {direction} {cells}")
    fitted = fit([r for m in FIT_ON for r in rows[(args.fit, m)]], peaks[args.fit])
    print(f"\nfitted on {args.fit}'s {' and '.join(FIT_ON)}: " + ", ".join(
        f"{d} k {k / 1e9:.1f} GB/s per channel, s {s:.2f}" for d, (k, s) in fitted.items()))
    print("batch norms' ms per step: measured, at the peak bandwidth (today's roofline), "
          "min(C k, s B)")
    for (gpu, m), mine in rows.items():
        got, full = sum(r[3] for r in mine), sum(r[2] for r in mine) / peaks[gpu]
        pred = predicted(mine, fitted, peaks[gpu])
        print(f"{gpu} {m:>16} {got * 1e3:6.1f} {full * 1e3:6.1f} ({(full / got - 1) * 100:+4.0f}%)"
              f" {pred * 1e3:6.1f} ({(pred / got - 1) * 100:+4.0f}%)")


if __name__ == "__main__":
    main()
