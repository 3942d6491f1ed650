"""The direct call path of allreduces on shared memory (:mod:`scaledl.collectives.shm_direct`):
taken from a combination's second call on (one-piece and windowed protocols alike), exact
against torch.distributed for every op and dtype, mixed freely with the whole path (another
rank's tensor may take either), never taken where it must not be (debug mode, shared arenas,
tensors that need grad, queued jobs), and failing named on every rank when the ranks' calls
differ."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

import scaledl
from scaledl.collectives.call import Call
from scaledl.collectives.communicator import communicator_for
from scaledl.collectives.shm_direct import DirectAllreduce
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16)
OPS = ("sum", "avg", "min", "max")
NUMELS = (1, 1000)
WINDOW = 128 << 10
"""The windows of these tests (``SCALEDL_SHM_WINDOW_MB=0.125``): the one-piece limit here."""
LIMIT_BYTES = (WINDOW, WINDOW + 1, 400_012)
"""Exactly the one-piece limit, just over it (the windowed protocol: a piece split into parts,
then a last element summed whole) and about three windows' worth that streams through them;
in elements of each dtype that runs them (float32 on NumPy, bfloat16 on torch: the two copies
of the rule meet at the same edge)."""


def _data(rank: int, numel: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1009 * rank + salt)
    return torch.randint(-50, 51, (numel,), generator=generator).to(dtype)


def _want(x: torch.Tensor, op: str, p: int) -> torch.Tensor:
    wide = x.to(torch.float64 if x.is_floating_point() else torch.int64, copy=True)
    dist.all_reduce(wide, op=dist.ReduceOp.SUM if op == "avg" else getattr(dist.ReduceOp,
                                                                           op.upper()))
    if op != "avg":
        return wide.to(x.dtype)
    if x.is_floating_point():  # the sum is exact; the division rounds in the tensor's dtype
        return wide.to(x.dtype) / p
    return torch.div(wide, p, rounding_mode="floor").to(x.dtype)


def _direct_cases(rank: int, p: int) -> dict[str, object]:
    topology = scaledl.init(backend="gloo")
    whole = [0]
    original = Call.job

    def counted(self: Call, *args: object) -> object:
        whole[0] += 1
        return original(self, *args)  # type: ignore[arg-type]

    Call.job = counted  # type: ignore[assignment, method-assign]
    failures: list[str] = []
    wrong_path: list[str] = []
    salt = 0
    for dtype in DTYPES:
        for op in OPS:
            size = torch.empty(0, dtype=dtype).element_size()
            limits = tuple(-(-nbytes // size) for nbytes in LIMIT_BYTES)
            for numel in NUMELS + (limits if dtype in (torch.float32, torch.bfloat16) else ()):
                before = whole[0]
                for _ in range(2):
                    salt += 1
                    x = _data(rank, numel, dtype, salt)
                    got = x.clone()
                    scaledl.allreduce(got, op=op)
                    if not torch.equal(got, _want(x, op, p)):
                        failures.append(f"{dtype} {op} {numel}")
                if whole[0] - before != 1:
                    wrong_path.append(f"{dtype} {op} {numel}: {whole[0] - before} whole calls")
    comm = communicator_for(None)
    prepared = comm.direct.get(("auto", "sum", torch.float32, 1000))

    # the same tensor again, a new one of the same size, a freed one's memory reused
    kept = torch.ones(1000)
    for value in (1.0, 2.0, 3.0):
        kept.fill_(value)
        scaledl.allreduce(kept)
        failures += [] if torch.all(kept == value * p) else [f"reused tensor {value}"]
        fresh = torch.full((1000,), value)
        scaledl.allreduce(fresh)
        failures += [] if torch.all(fresh == value * p) else [f"fresh tensor {value}"]

    # one rank's tensor cannot take the direct path (a view with a stride): both paths meet
    before = whole[0]
    base = torch.arange(2000, dtype=torch.float32)
    mixed = base[::2] if rank == 0 else base[::2].clone()
    scaledl.allreduce(mixed)
    failures += [] if torch.equal(mixed, torch.arange(0, 2000, 2.0) * p) else ["mixed paths"]
    mixed_whole = whole[0] - before

    # a tensor that needs grad and a shared arena's tensor take the whole path
    before = whole[0]
    leaf = torch.ones(1000, requires_grad=True)
    with torch.no_grad():
        scaledl.allreduce(leaf)
    arena = comm.shared_buffers([1000], torch.float32)
    assert arena is not None
    arena[0].fill_(rank + 1)
    for _ in range(2):
        scaledl.allreduce(arena[0])
    failures += [] if torch.all(leaf == p) else ["requires_grad"]
    failures += [] if torch.all(arena[0] == sum(range(1, p + 1)) * p) else ["arena"]
    guarded_whole = whole[0] - before

    # another topology argument than the preparing call's (None) takes the whole path
    before = whole[0]
    for _ in range(2):
        scaledl.allreduce(torch.ones(1000), topology=topology)
    guarded_whole += whole[0] - before

    # an asynchronous job queued first runs first; the synchronous call then follows in order
    queued, after = torch.ones(1000), torch.full((1000,), 2.0)
    handle = scaledl.allreduce(queued, async_op=True)
    scaledl.allreduce(after)
    assert handle is not None
    handle.wait()
    failures += [] if torch.all(queued == p) and torch.all(after == 2 * p) else ["async order"]

    # an overflow to inf is the caller's, as in torch: no NumPy warning or error whatever
    # NumPy's error state, which is the caller's again afterwards (both paths, both sizes)
    for numel in (1000, 40000):
        huge = torch.full((numel,), 3e38)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with np.errstate(all="raise"):
                for _ in range(2):
                    scaledl.allreduce(huge)
                kept_state = np.geterr()["over"]
        failures += [] if bool(torch.isinf(huge).all()) else [f"overflow {numel}"]
        failures += [] if kept_state == "raise" else [f"error state {kept_state}"]
    unit = float(np.finfo(np.float32).smallest_subnormal)
    for _ in range(2):  # AVG's division of subnormals underflows: the caller's too
        tiny = torch.full((1000,), unit if rank == 0 else 2 * unit)
        with np.errstate(all="raise"):
            scaledl.allreduce(tiny, op="avg")
        failures += [] if bool((tiny <= 2 * unit).all()) else ["avg of subnormals"]

    # a lazily negated tensor (x.conj().imag: its memory holds the negatives of what it
    # shows) is reduced as the values it shows, on either path and size; the group stays usable
    for numel in (1, 1000, 40000):
        for _ in range(2):
            z = torch.complex(torch.zeros(numel), torch.full((numel,), float(rank + 1)))
            negated = z.conj().imag
            scaledl.allreduce(negated)
            failures += [] if negated.is_neg() else [f"negated {numel}: not lazily negated"]
            want = -float(sum(range(1, p + 1)))
            failures += [] if bool(torch.all(negated == want)) else [f"negated {numel}"]

    # debug mode's agreement check runs on every call: no direct path for its communicator
    group = dist.new_group(list(range(p)))
    checked = communicator_for(group)
    checked.check = True
    before = whole[0]
    for _ in range(2):
        scaledl.allreduce(torch.ones(10), group=group)
    debug_whole = whole[0] - before
    debug_entry = checked.direct.get(("auto", "sum", torch.float32, 10), "missing")
    Call.job = original  # type: ignore[method-assign]
    return {"failures": failures, "wrong_path": wrong_path,
            "prepared": isinstance(prepared, DirectAllreduce), "mixed": mixed_whole,
            "guarded": guarded_whole, "debug": debug_whole, "debug_entry": debug_entry}


@pytest.mark.parametrize("world_size", [2, 3])
def test_direct_path_is_taken_exact_and_mixes_with_the_whole_path(world_size: int) -> None:
    results = run_ranks(world_size, _direct_cases, timeout=120,
                        env={"SCALEDL_SHM_WINDOW_MB": "0.125"})
    for rank, result in enumerate(results):
        assert result["failures"] == [] and result["wrong_path"] == [], (rank, result)
        assert result["prepared"]
        assert result["mixed"] == (1 if rank == 0 else 0)
        assert result["guarded"] == 5  # requires_grad once, the arena and a topology twice
        assert result["debug"] == 2 and result["debug_entry"] is None


def _mismatched(rank: int, world: int) -> str:
    scaledl.init(backend="gloo")
    for _ in range(2):  # both sizes prepared on both ranks: the next calls go direct
        scaledl.allreduce(torch.ones(8))
        scaledl.allreduce(torch.ones(6))
    try:
        scaledl.allreduce(torch.ones(8 if rank == 0 else 6))
    except RuntimeError as error:
        return str(error)
    return "NO ERROR"


def test_direct_calls_that_differ_fail_named_on_every_rank() -> None:
    messages = run_ranks(2, _mismatched, timeout=60, env={"SCALEDL_TIMEOUT": "20"})
    assert any("allreduce of 8 float32 (sum)" in m and "allreduce of 6 float32 (sum)" in m
               for m in messages), messages
    for message in messages:
        assert "through shared memory; every rank of the group must make the same" in message \
            or "aborted the shared-memory collective" in message, messages
