"""The gradient allreduce step of ResNet-50 (25.6M float32 gradients) with each compression.

Run on every rank of a job (``scaledl cluster run ... -- python this.py``, or torchrun).  Each
rank holds ResNet-50's gradients (its 161 parameters' shapes, random values seeded per rank),
planned into DataParallel's 25 MiB buckets in reverse order.  One *step* launches every bucket
the way ``scaledl.DataParallel`` launches it from backward (uncompressed: an asynchronous
scaledl allreduce-average of the bucket; compressed: the compression's job on the
communicator), then waits for all of them; the time of a step is the slowest rank's.  The
buckets are refilled with the gradients before each step, outside the timing (a compression
works in place).  Methods are interleaved within each repeat so the machine's load (shared with
other users) hits them alike.  Each result is checked against the uncompressed average.

Beside each step, the same compression runs with its collectives left out (every rank at once,
so the cores are shared as in the step): the compute a step cannot avoid on this machine.  For
PowerSGD under the host placement that is each rank's own share of the arithmetic.

A method ``powersgd:R:flat`` is PowerSGD of rank R with ``placement="flat"`` (every rank runs
the whole algorithm over all ranks), ``powersgd:R:hosts`` with ``placement="hosts"`` (exact
inside each host, compressed across), measured in the same run so the two compare side by
side under the same load; ``powersgd:R`` is the default (``"auto"``).

Writes one JSON object: the configuration, and per method the step times (s), their median,
min and max, its ratio to the uncompressed median, the compute-only median, the bytes sent per
rank into the collectives (as the wire counted them), and the error against the exact
average.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

import scaledl
from scaledl import collectives
from scaledl.collectives.communicator import communicator_for
from scaledl.models.registry import build_model
from scaledl.sync import (
    BucketLayout, CastCompression, GradientCompression, PowerSGD, plan_buckets,
    resolve_compression,
)
from scaledl.sync.host_shares import Bounds, HostShares
from scaledl.sync.reducer import buffer_numels
from scaledl.sync.wire import Wire

MiB = 1 << 20


def compression_of(method: str) -> GradientCompression:
    """``resolve_compression``'s, or for ``powersgd:R:flat`` and ``powersgd:R:hosts`` PowerSGD
    with that placement."""
    name, _, placement = method.rpartition(":")
    if placement in ("flat", "hosts") and name.startswith("powersgd"):
        return PowerSGD(rank=int(name.partition(":")[2] or 4), placement=placement)
    return resolve_compression(method)


class LocalWire:
    """A wire whose collectives do nothing: the compression's own arithmetic, timed alone."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.sent = 0

    def allreduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """Leave ``tensor`` as it is."""


class LocalShares(HostShares):
    """Host shares whose collectives do nothing: the host placement's arithmetic, alone."""

    def __init__(self, real: HostShares) -> None:  # pylint: disable=super-init-not-called
        self.__dict__.update(real.__dict__)

    def reduce_to_owners(self, buffer: torch.Tensor, bounds: Bounds) -> None:
        """Nothing."""

    def gather_from_owners(self, buffer: torch.Tensor, bounds: Bounds) -> None:
        """Nothing."""

    def allreduce_across(self, tensor: torch.Tensor) -> None:
        """Nothing."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,bf16,fp16,powersgd:4:hosts,powersgd:4:flat,"
                        "powersgd:1:hosts,powersgd:1:flat")
    parser.add_argument("--algorithm", default="hierarchical")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--json", default=None, help="write the results here (rank 0)")
    args = parser.parse_args()
    topology = scaledl.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_model("resnet50", (3, 224, 224), 1000)
    named = [(name, p) for name, p in model.named_parameters()]
    buckets = plan_buckets(named, int(args.bucket_mb * MiB))
    shapes = {name: tuple(p.shape) for name, p in named}
    layouts = [BucketLayout(tuple(shapes[n] for n in b.names), b.offsets) for b in buckets]
    generator = torch.Generator().manual_seed(1 + rank)
    sources = [torch.randn(b.numel, generator=generator) for b in buckets]
    del model, named
    # the bucket buffers in shared memory where the hosts allow, as DataParallel has them
    buffers = communicator_for(None).shared_buffers(buffer_numels(buckets, False),
                                                    torch.float32) \
        or [torch.empty(b.numel) for b in buckets]
    methods = args.methods.split(",")
    wires = {m: Wire(args.algorithm) for m in methods if m != "none"}
    compressions = {m: compression_of(m) for m in methods if m != "none"}
    for compression in compressions.values():  # wire buffers in shared memory, as DataParallel
        if isinstance(compression, CastCompression):
            shared = communicator_for(None).shared_buffers(
                buffer_numels(buckets, False), compression.wire_dtype)
            if shared is not None:
                compression.place_wire_buffers(dict(enumerate(shared)))
    alone = {m: compression_of(m) for m in methods if m != "none"}
    local_wire = LocalWire(world)

    def compute(method: str) -> float:
        for buffer, source in zip(buffers, sources):
            buffer.copy_(source)
        dist.barrier()
        started = time.perf_counter()
        placed = compressions[method]
        shares = placed._shares[1] if isinstance(placed, PowerSGD) and placed._shares else None
        for b, buffer, layout in zip(buckets, buffers, layouts):
            own = alone[method]
            if shares is not None and isinstance(own, PowerSGD):  # this rank's part only
                finish = own._hosts_job(LocalShares(shares), local_wire,  # type: ignore[arg-type]
                                        b.index, buffer, layout)
                if finish is not None:
                    finish()
            else:
                own.average(b.index, buffer, layout, local_wire)  # type: ignore[arg-type]
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item())

    def step(method: str) -> float:
        for buffer, source in zip(buffers, sources):
            buffer.copy_(source)
        dist.barrier()
        started = time.perf_counter()
        if method == "none":
            handles = [collectives.allreduce(buffer, op="avg", algorithm=args.algorithm,
                                             async_op=True) for buffer in buffers]
        else:
            handles = [compressions[method].start(b.index, buffer, layout, wires[method])
                       for b, buffer, layout in zip(buckets, buffers, layouts)]
        for handle in handles:
            assert handle is not None
            handle.wait()
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item())

    total = sum(b.numel for b in buckets)
    step("none")
    exact = [buffer.clone() for buffer in buffers]
    errors = {}
    sent: dict[str, int] = {}
    for method in methods:  # warm-up, and each result checked against the exact average
        before = wires[method].sent if method in wires else 0
        step(method)
        sent[method] = wires[method].sent - before if method in wires else total * 4
        worst = max(float((b - e).abs().max() / e.abs().max()) for b, e in zip(buffers, exact))
        errors[method] = worst
        if method in ("none", "bf16", "fp16") and worst > 1e-2:
            raise SystemExit(f"{method}: relative error {worst:.3g} against the exact average")
    placements = {m: c.placed for m, c in compressions.items() if isinstance(c, PowerSGD)}
    times: dict[str, list[float]] = {m: [] for m in methods}
    computing: dict[str, list[float]] = {m: [] for m in methods if m != "none"}
    for method in computing:
        compute(method)  # warm-up
    for _ in range(args.repeats):
        for method in methods:
            times[method].append(step(method))
            if method in computing:
                computing[method].append(compute(method))
    report = {
        "what": "allreduce step of ResNet-50's gradients (DataParallel's launch path)",
        "gradients": total, "buckets": len(buckets), "bucket_mb": args.bucket_mb,
        "algorithm": args.algorithm, "topology": topology.spec, "world_size": world,
        "repeats": args.repeats, "threads": torch.get_num_threads(),
        "torch": torch.__version__, "python": sys.version.split()[0],
        "machine": platform.machine(), "host": platform.node(), "methods": {},
    }
    baseline = statistics.median(times[methods[0]])
    for method in methods:
        median = statistics.median(times[method])
        report["methods"][method] = {  # type: ignore[index]
            "times_s": times[method], "median_s": median, "min_s": min(times[method]),
            "max_s": max(times[method]), "speedup_vs_first": baseline / median,
            "bytes_sent_per_rank_input": sent[method], "relative_error": errors[method],
            "placement": placements.get(method),
            "compute_only_median_s": statistics.median(computing[method])
            if method in computing else 0.0,
        }
    if rank == 0:
        text = json.dumps(report, indent=1)
        print(text)
        if args.json:
            with open(args.json, "w") as handle:
                handle.write(text + "\n")
    scaledl.shutdown()


if __name__ == "__main__":
    main()
