"""Random sequences of every call that shares the shared-memory protocol, each result checked.

Every rank draws the same sequence of calls from one seed (so the ranks agree on it, as a real
program does) and its own data from ``(seed, call, rank)``, so each rank can compute what every
peer contributed and check the result exactly: data are small integers, whose sums are exact in
any order.  The call kinds are everything that moves through a host's shared memory:

- ``allreduce`` through the windows (pieces that are summed whole, pieces that are split into
  parts, slices that stream through several windows), synchronous and asynchronous;
- ``arena``: allreduce of a tensor that lives in a shared arena (reduced in place);
- ``broadcast`` and ``reduce`` from every root, ``allgather``, ``reduce_scatter``;
- ``hierarchical`` and ``torus`` with their shared-memory stages, on the layout of the job
  (``2x2`` for four ranks, whose stages run on axis subgroups);
- ``other``: the same calls on a second communicator of the same ranks, whose jobs interleave
  with the first's;
- ``dp``: a DataParallel step of a model with float buffers, integer buffers, BatchNorm or none,
  its averaged gradients against the mean of every rank's own.

With ``SCALEDL_SHM_JITTER`` set (:mod:`scaledl.transport.shm_jitter`), every control-word read,
write and wait of every call sleeps at random.  ``tests/distributed/test_shm_jitter.py`` runs
short seeded sequences; ``benchmarks/reliability/shm_soak.py`` runs 100,000 calls and more.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import scaledl
from scaledl.collectives.communicator import communicator_for

KINDS = ("allreduce", "async", "arena", "broadcast", "reduce", "allgather", "reduce_scatter",
         "hierarchical", "torus", "other", "dp")
SIZES = (0, 1, 3, 1000, 17_000, 40_003)
"""Elements: empty, one, fewer than the ranks, a direct piece, a direct piece of half a window
(as float32), and one that streams through two 128 KiB windows (a piece split into parts, then
a small one summed whole)."""
WINDOW_ENV = {"SCALEDL_SHM_WINDOW_MB": "0.125"}
"""Small windows, so that the larger sizes stream through several pieces and pieces of both
kinds run."""
ARENA_NUMELS = (1000, 40_003)


def _data(seed: int, call: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(((seed * 100_003 + call) * 31 + rank) % (1 << 62))
    return torch.randint(-8, 9, (numel,), generator=generator).to(dtype)


class _FloatBuffers(nn.Module):
    """A transformer-style block's buffers: a positional table and a scale, all floating point."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.register_buffer("position", torch.linspace(0, 1, 8))
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear((x + self.position) * self.scale)


class _IntBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x)


def _models() -> dict[str, nn.Module]:
    return {
        "float-buffers": _FloatBuffers(),
        "int-buffers": _IntBuffers(),
        "batchnorm": nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Linear(6, 4)),
        "no-buffers": nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 4)),
    }


class Schedule:
    """One rank's part of a random schedule: its groups, arena and models, made once."""

    def __init__(self, rank: int, world_size: int, seed: int, kinds: tuple[str, ...] = KINDS):
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.layout = scaledl.Topology.parse("2x2", 4, rank) if world_size == 4 else None
        staged = ("hierarchical", "torus")  # need a layout of several hosts: 2x2 on 4 ranks
        self.kinds = tuple(k for k in kinds if self.layout is not None or k not in staged)
        self.choose = random.Random(seed)  # the same draws on every rank
        self.other = dist.new_group(list(range(world_size)))
        buffers = communicator_for(None).shared_buffers(list(ARENA_NUMELS), torch.float32)
        if buffers is None:
            raise RuntimeError("no shared-memory arena: these ranks do not share a host's memory")
        self.arena = buffers
        models = _models()
        torch.manual_seed(seed)
        self.wrapped: dict[str, tuple[scaledl.DataParallel, nn.Module]] = {}
        for name, model in models.items():
            model = model.double()
            reference = _models()[name].double()
            wrapped = scaledl.DataParallel(model, algorithm="shm", bucket_mb=0.0005)
            reference.load_state_dict(wrapped.module.state_dict())
            self.wrapped[name] = (wrapped, reference)
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.calls = 0

    # -- the expected results ---------------------------------------------------------------
    def _every(self, numel: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        return [_data(self.seed, self.calls, r, numel, dtype) for r in range(self.world_size)]

    def _check(self, what: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got, want):
            diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
            self.failures.append(f"call {self.calls} ({what}): wrong result, max error {diff}")

    # -- one call -----------------------------------------------------------------------------
    def step(self) -> None:
        """Draw and run one call, checking its result."""
        kind = self.choose.choice(self.kinds)
        numel = self.choose.choice(SIZES)
        root = self.choose.randrange(self.world_size)
        op = self.choose.choice(("sum", "max"))
        getattr(self, f"_{kind}")(numel, root, op)
        self.counts[kind] += 1
        self.calls += 1

    def _reduced(self, parts: list[torch.Tensor], op: str) -> torch.Tensor:
        stacked = torch.stack(parts)
        return stacked.sum(0) if op == "sum" else stacked.amax(0)

    def _allreduce(self, numel: int, root: int, op: str, algorithm: str = "shm",
                   group: Any = None, topology: Any = None) -> None:
        parts = self._every(numel)
        got = parts[self.rank].clone()
        scaledl.allreduce(got, op=op, algorithm=algorithm, group=group, topology=topology)
        self._check(f"allreduce {algorithm} {numel} {op}", got, self._reduced(parts, op))

    def _async(self, numel: int, root: int, op: str) -> None:
        first, second = self._every(numel), self._every(numel + 5, torch.int64)
        a, b = first[self.rank].clone(), second[self.rank].clone()
        handles = [scaledl.allreduce(a, op=op, algorithm="shm", async_op=True),
                   scaledl.broadcast(b, src=root, algorithm="shm", async_op=True)]
        for handle in handles:
            assert handle is not None
            handle.wait()
        self._check(f"async allreduce {numel} {op}", a, self._reduced(first, op))
        self._check(f"async broadcast {numel + 5} from {root}", b, second[root])

    def _arena(self, numel: int, root: int, op: str) -> None:
        index = self.choose.randrange(len(self.arena))
        buffer = self.arena[index]
        parts = self._every(buffer.numel())
        buffer.copy_(parts[self.rank])
        scaledl.allreduce(buffer, op=op, algorithm="shm")
        self._check(f"arena allreduce {buffer.numel()} {op}", buffer, self._reduced(parts, op))

    def _broadcast(self, numel: int, root: int, op: str) -> None:
        parts = self._every(numel)
        got = parts[self.rank].clone()
        scaledl.broadcast(got, src=root, algorithm="shm")
        self._check(f"broadcast {numel} from {root}", got, parts[root])

    def _reduce(self, numel: int, root: int, op: str) -> None:
        parts = self._every(numel)
        got = parts[self.rank].clone()
        scaledl.reduce(got, dst=root, op=op, algorithm="shm")
        want = self._reduced(parts, op) if self.rank == root else parts[self.rank]
        self._check(f"reduce {numel} {op} to {root}", got, want)

    def _allgather(self, numel: int, root: int, op: str) -> None:
        parts = self._every(numel)
        got = torch.empty(numel * self.world_size)
        scaledl.allgather(got, parts[self.rank], algorithm="shm")
        self._check(f"allgather {numel}", got, torch.cat(parts))

    def _reduce_scatter(self, numel: int, root: int, op: str) -> None:
        parts = self._every(numel * self.world_size)
        got = torch.empty(numel)
        scaledl.reduce_scatter(got, parts[self.rank], op=op, algorithm="shm")
        want = self._reduced(parts, op)[self.rank * numel:(self.rank + 1) * numel]
        self._check(f"reduce_scatter {numel} {op}", got, want)

    def _hierarchical(self, numel: int, root: int, op: str) -> None:
        self._allreduce(numel, root, op, "hierarchical[shm,shm]", topology=self.layout)

    def _torus(self, numel: int, root: int, op: str) -> None:
        self._allreduce(numel, root, op, "torus[shm,shm]", topology=self.layout)

    def _other(self, numel: int, root: int, op: str) -> None:
        parts = self._every(numel)
        mine = parts[self.rank].clone()
        theirs = parts[self.rank].clone()
        handle = scaledl.allreduce(mine, op=op, algorithm="shm", group=self.other,
                                   async_op=True)
        scaledl.broadcast(theirs, src=root, algorithm="shm")
        assert handle is not None
        handle.wait()
        self._check(f"allreduce {numel} {op} on the second group", mine,
                    self._reduced(parts, op))
        self._check(f"broadcast {numel} from {root} beside it", theirs, parts[root])

    def _dp(self, numel: int, root: int, op: str) -> None:
        name = self.choose.choice(sorted(self.wrapped))
        wrapped, reference = self.wrapped[name]
        inputs = self._every(4 * 8, torch.float64)
        wrapped.zero_grad()
        wrapped(inputs[self.rank].view(4, 8)).square().sum().backward()
        mean: dict[str, torch.Tensor] = {}
        for rank in range(self.world_size):
            reference.zero_grad()
            reference.load_state_dict(wrapped.module.state_dict())
            reference(inputs[rank].view(4, 8)).square().sum().backward()
            for key, param in reference.named_parameters():
                assert param.grad is not None
                mean[key] = mean.get(key, 0) + param.grad / self.world_size
        for key, param in wrapped.module.named_parameters():
            assert param.grad is not None
            if not torch.allclose(param.grad, mean[key], rtol=1e-12, atol=1e-12):
                self.failures.append(f"call {self.calls} (DataParallel {name}): gradient of "
                                     f"{key} is not the mean of the ranks'")


def run(rank: int, world_size: int, seed: int, calls: int,
        kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """Run ``calls`` random calls on this rank; return counts, failures and the jitter's work."""
    scaledl.init()
    schedule = Schedule(rank, world_size, seed, kinds)
    for _ in range(calls):
        schedule.step()
    jitter = communicator_for(None).shm
    return {"counts": dict(schedule.counts), "failures": schedule.failures,
            "pauses": jitter.jitter.pauses if jitter and jitter.jitter else 0}
