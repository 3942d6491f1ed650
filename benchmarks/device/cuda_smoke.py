"""scaledl's collectives, DataParallel (plain, with ``device_ids`` placing the inputs, and with
each gradient compression) and the DDP hook on CUDA tensors over Gloo (two ranks on one GPU), and
every algorithm, ``device_ids`` and each compression over NCCL with one rank: a correctness check
for a machine with a GPU.

    python benchmarks/device/cuda_smoke.py

Prints one JSON line per check (``ok`` true or the first line of the error) and exits 1 if any
failed.  NCCL refuses two ranks on one GPU, so NCCL's multi-rank paths need two GPUs.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import scaledl

DEVICE = os.environ.get("SMOKE_DEVICE", "cuda")  # cpu: a dry run of the Gloo checks
COMPRESSIONS = ("bf16", "fp16", "powersgd:2")
ALGORITHMS = ("ring", "multiring", "halving_doubling", "tree", "chain", "hierarchical", "torus",
              "native", "shm", "auto")


def _report(rank: int, check: str, fn: Callable[[], object]) -> bool:
    try:
        fn()
        ok: object = True
    except Exception as error:  # noqa: BLE001 - every failure is reported, none hides another
        lines = str(error).strip().splitlines() or [repr(error)]
        ok = f"{type(error).__name__}: {lines[0]}"
        if os.environ.get("SMOKE_TRACE"):
            traceback.print_exc()
    if rank == 0:
        print(json.dumps({"check": check, "ok": ok}), flush=True)
    return ok is True


def _allreduce(algorithm: str, world: int, rank: int) -> None:
    for n in (1, 1000, 1 << 20):
        t = torch.full((n,), float(rank + 1), device=DEVICE)
        scaledl.allreduce(t, algorithm=algorithm)
        expected = world * (world + 1) / 2
        assert t.device.type == DEVICE, "result left the GPU"
        assert torch.all(t == expected).item(), f"{n} elements: got {t[:4].tolist()}"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))


def _train(wrap: Callable[[nn.Module], nn.Module], world: int, rank: int,
           placed: bool = False) -> None:
    """Three steps, then the replicas must be equal; ``placed``: the inputs stay in host memory
    and the wrapper must move them (``device_ids``) and its output must be on the GPU."""
    net = wrap(_model().to(DEVICE))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x = torch.randn(4, 3, 16, 16, generator=gen)
        y = torch.randint(0, 10, (4,), generator=gen).to(DEVICE)
        out = net(x if placed else x.to(DEVICE))
        assert out.device.type == DEVICE, f"the output is on {out.device}"
        opt.zero_grad()
        nn.functional.cross_entropy(out, y).backward()
        assert all(p.grad is not None and p.grad.device.type == DEVICE
                   for p in net.parameters()), "a gradient left the GPU"
        if hasattr(net, "finish_gradient_synchronization"):
            net.finish_gradient_synchronization()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, gathered[0]) for g in gathered), "replicas differ after 3 steps"


def _gloo_worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    scaledl.init(backend="gloo", timeout=60, topology="1x2")
    failed = 0
    for algorithm in ALGORITHMS:
        failed += not _report(rank, f"gloo-cuda allreduce {algorithm}",
                              lambda a=algorithm: _allreduce(a, world, rank))
    failed += not _report(rank, "gloo-cuda DataParallel ring",
                          lambda: _train(lambda m: scaledl.DataParallel(m, algorithm="ring"),
                                         world, rank))

    if DEVICE == "cuda":
        failed += not _report(rank, "gloo-cuda DataParallel device_ids=[0] places the inputs",
                              lambda: _train(lambda m: scaledl.DataParallel(m, device_ids=[0]),
                                             world, rank, placed=True))
    for spec in COMPRESSIONS:
        failed += not _report(
            rank, f"gloo-cuda DataParallel compression {spec}",
            lambda c=spec: _train(lambda m: scaledl.DataParallel(m, compression=c), world, rank))
        failed += not _report(
            rank, f"gloo-cuda DDP + ddp_hook(compression={spec})",
            lambda c=spec: _train(lambda m: _ddp(m, c), world, rank))
    failed += not _report(rank, "gloo-cuda DataParallel hierarchical powersgd:2",
                          lambda: _train(lambda m: scaledl.DataParallel(
                              m, algorithm="hierarchical", compression="powersgd:2"),
                              world, rank))

    def ddp(m: nn.Module) -> nn.Module:
        wrapped = nn.parallel.DistributedDataParallel(m)
        wrapped.register_comm_hook(None, scaledl.ddp_hook("ring"))
        return wrapped
    failed += not _report(rank, "gloo-cuda DDP + ddp_hook ring", lambda: _train(ddp, world, rank))
    scaledl.shutdown()
    sys.exit(1 if failed else 0)


def _ddp(m: nn.Module, compression: str) -> nn.Module:
    wrapped = nn.parallel.DistributedDataParallel(m)
    wrapped.register_comm_hook(None, scaledl.ddp_hook("ring", compression=compression))
    return wrapped


def _nccl_one_rank() -> int:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    scaledl.init(timeout=60, topology="1x1")
    def default_is_nccl() -> None:
        assert dist.get_backend() == "nccl", f"scaledl.init() chose {dist.get_backend()}"

    failed = not _report(0, "default backend with CUDA is nccl", default_is_nccl)
    for algorithm in ALGORITHMS:
        failed += not _report(0, f"nccl one rank allreduce {algorithm}",
                              lambda a=algorithm: _allreduce(a, 1, 0))
    failed += not _report(0, "nccl one rank DataParallel device_ids=[0] places the inputs",
                          lambda: _train(lambda m: scaledl.DataParallel(m, device_ids=[0]), 1, 0,
                                         placed=True))
    for spec in COMPRESSIONS:
        failed += not _report(0, f"nccl one rank DataParallel compression {spec}",
                              lambda c=spec: _train(
                                  lambda m: scaledl.DataParallel(m, compression=c), 1, 0))
    scaledl.shutdown()
    return int(failed)


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.spawn(_gloo_worker, args=(2, port), nprocs=2, join=False)
    try:
        while not context.join(timeout=240):  # False until every worker has ended
            pass
        gloo_failed = False
    except Exception as error:  # noqa: BLE001 - a worker that failed: reported, then go on
        print(json.dumps({"check": "gloo-cuda workers", "ok": str(error).splitlines()[0]}))
        gloo_failed = True
    nccl_failed = _nccl_one_rank() > 0 if DEVICE == "cuda" else False
    return int(gloo_failed or nccl_failed)


if __name__ == "__main__":
    sys.exit(main())
