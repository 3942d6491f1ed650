"""``scaledl.DataParallel`` on the models users write trains as its reference does.

The cases are :mod:`tests.distributed.dp_user_models`: every zoo architecture; buffers only
float (a positional encoding under a transformer block), only integer, none; batch norm; tied
weights; unused parameters (on some ranks, on all); parameters frozen before wrapping; sparse
embeddings (with SparseAdam); mixed dtypes with an empty parameter; activation checkpointing.
:func:`plan` crosses them with every allreduce algorithm of the registry (``auto`` included),
both thread settings (one intra-op thread, and torch's default) and two bucket sizes (DDP's
25 MB, and about one bucket per parameter).  Each rank trains ``STEPS`` steps of SGD with
momentum and weight decay on its slice of fixed global batches, starting from different weights
(wrapping must give it rank 0's).  Then:

- its parameters and buffers equal the reference's within rtol 1e-5 / atol 1e-6 (1e-5 for the
  deep batch-norm zoo models; integer buffers exactly): one process on the global batch, or,
  for batch norm, torch's DDP over the same Gloo group rank by rank (why: the docstring of
  ``dp_user_models``);
- every rank holds bit-identical parameters (each algorithm hands every rank the same average);
- the gradients were reduced once per step.

The learning rate (0.01) and the inputs keep the comparison well conditioned: the same training
in float32 and float64 ends within about 1e-7.  The whole matrix of a world size runs inside
one process group (one spawn of 2 ranks, one of 3): about 65 s for both on two shared cores.
Each group gets the timeout of ``SCALEDL_TIMEOUT`` (20 s unless set), so a hang fails fast and
named.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import scaledl
from scaledl.bootstrap import TIMEOUT_ENV, resolve_timeout
from scaledl.collectives import available
from scaledl.models.registry import available_models
from scaledl.topology import Topology
from tests.distributed.dp_user_models import (
    FULL_SIZE_ONLY, PER_RANK, Case, user_cases, zoo_cases,
)
from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

STEPS = 3
DEFAULT_THREADS = torch.get_num_threads()
"""Torch's default intra-op thread count in this (the parent) process."""
ALGORITHMS = available("allreduce")
TIMEOUT_S = "20"
SMALL_BUCKET_MB = 0.002
"""About 2 KB: most parameters get a bucket of their own.  Half the configurations use it
(alternating by algorithm and thread setting), the others DDP's default of 25 MB."""


def _cases() -> dict[str, Case]:
    return {case.name: case for case in user_cases() + zoo_cases()}


def _optimizers(case: Case, model: nn.Module) -> list[torch.optim.Optimizer]:
    """SGD with momentum and weight decay; SparseAdam for sparse embeddings, as users pair them
    (it refuses dense gradients)."""
    sparse = [m.weight for m in model.modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
    dense = [p for p in model.parameters() if all(p is not s for s in sparse)]
    optimizers: list[torch.optim.Optimizer] = [
        torch.optim.SGD(dense, lr=0.01, momentum=0.9, weight_decay=0.01)]
    if sparse:
        optimizers.append(torch.optim.SparseAdam(sparse, lr=0.01))
    return optimizers


def _build(case: Case, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return case.build()


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    named = dict(model.named_parameters())
    named.update(model.named_buffers())
    return {name: tensor.detach().clone() for name, tensor in named.items()}


def _steps(case: Case, model: nn.Module, forward: nn.Module, world_size: int,
           part: slice) -> Iterator[None]:
    optimizers = _optimizers(case, model)
    for step in range(STEPS):
        *inputs, target = (t[part] for t in case.batch(world_size * PER_RANK, step))
        for optimizer in optimizers:
            optimizer.zero_grad()
        case.loss(forward(*inputs), target).backward()
        for optimizer in optimizers:
            optimizer.step()
        yield


def _single(case: Case, world_size: int) -> dict[str, torch.Tensor]:
    """One process, the whole global batch."""
    model = _build(case, 0)
    for _ in _steps(case, model, model, world_size, slice(None)):
        pass
    return _state(model)


def _slice(rank: int) -> slice:
    return slice(rank * PER_RANK, (rank + 1) * PER_RANK)


def _ddp(case: Case, rank: int, world_size: int, group: Any) -> dict[str, torch.Tensor]:
    """torch's DistributedDataParallel on the same Gloo group, this rank's slice."""
    model = _build(case, 0)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group)
    for _ in _steps(case, model, ddp, world_size, _slice(rank)):
        pass
    return _state(model)


def _topology(algorithm: str, world_size: int) -> Topology | None:
    if algorithm in ("torus", "hierarchical"):
        return Topology(axes=(1, world_size), explicit=True)
    return None


def _data_parallel(case: Case, algorithm: str, bucket_mb: float, rank: int, world_size: int,
                   group: Any) -> dict[str, torch.Tensor]:
    model = _build(case, 1000 * rank)  # rank 0's weights must reach every rank
    wrapped = scaledl.DataParallel(model, algorithm=algorithm, bucket_mb=bucket_mb, group=group,
                                   topology=_topology(algorithm, world_size))
    try:
        for _ in _steps(case, model, wrapped, world_size, _slice(rank)):
            pass
    finally:
        wrapped.reducer.remove()
    state = _state(model)
    state[SYNCS] = torch.tensor(wrapped.stats.syncs)
    return state


SYNCS = "<gradient reductions>"
"""Key of the number of reductions in a trained state: one per step."""


def _compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float
             ) -> list[str]:
    failures = []
    if SYNCS in got and int(got[SYNCS]) != STEPS:
        failures.append(f"{int(got[SYNCS])} gradient reductions in {STEPS} steps")
    for name, expected in want.items():
        actual = got[name]
        if expected.is_floating_point():
            close = torch.allclose(actual, expected, rtol=1e-5, atol=atol)
        else:
            close = torch.equal(actual, expected)
        if not close:
            diff = (actual.double() - expected.double()).abs().max().item()
            failures.append(f"{name} differs by {diff:.2e}")
    return failures


def _same_on_every_rank(state: dict[str, torch.Tensor], names: list[str], group: Any) -> bool:
    flat = torch.cat([state[name].reshape(-1).double() for name in names])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, flat, group=group)
    return all(torch.equal(flat, other) for other in everyone)


Plan = list[tuple[int, str, list[str]]]
"""``(intra-op threads, case name, algorithms)`` in the order a worker runs them."""


def plan() -> Plan:
    """What one world size runs.  With one thread: every user case with every algorithm, every
    zoo case with ``auto`` and one explicit algorithm (each in turn, so every algorithm trains
    zoo models).  With torch's default: every user case with ``auto`` and two explicit
    algorithms, the light zoo cases with one (again in turn)."""
    explicit = [a for a in ALGORITHMS if a != "auto"]
    turn = iter(range(10_000))

    def next_explicit() -> str:
        return explicit[next(turn) % len(explicit)]

    steps: Plan = [(1, case.name, ALGORITHMS) for case in user_cases()]
    steps += [(1, case.name, ["auto", next_explicit()]) for case in zoo_cases()]
    steps += [(DEFAULT_THREADS, case.name, ["auto", next_explicit(), next_explicit()])
              for case in user_cases()]
    steps += [(DEFAULT_THREADS, case.name, [next_explicit()])
              for case in zoo_cases() if not case.heavy]
    return steps


def _matrix(rank: int, world_size: int, steps: Plan) -> dict[str, Any]:
    """Run ``steps`` on one group: the failures, and seconds by case and by algorithm."""
    group = dist.new_group(timeout=resolve_timeout(None))
    cpu = time.process_time()
    cases = _cases()
    failures: list[str] = []
    seconds: dict[str, float] = {}
    for thread_count, name, algorithms in steps:
        torch.set_num_threads(thread_count)
        case = cases[name]
        start = time.perf_counter()
        want = (_ddp(case, rank, world_size, group) if case.reference == "ddp"
                else _single(case, world_size))
        parameters = [n for n, _ in _build(case, 0).named_parameters()]
        for index, algorithm in enumerate(algorithms):
            bucket_mb = SMALL_BUCKET_MB if (index + thread_count) % 2 else 25.0
            where = (f"{name} / {algorithm} / {thread_count} threads / bucket_mb {bucket_mb} / "
                     f"rank {rank}")
            began = time.perf_counter()
            try:
                got = _data_parallel(case, algorithm, bucket_mb, rank, world_size, group)
            except Exception as error:  # the group may be unusable now: stop here
                failures.append(f"{where}: {type(error).__name__}: {error}")
                return {"failures": failures, "seconds": seconds}
            key = f"{algorithm} x{thread_count}"
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began
            failures += [f"{where}: {message}" for message in _compare(got, want, case.atol)]
            if not _same_on_every_rank(got, parameters, group):
                failures.append(f"{where}: parameters differ between ranks")
        key = f"{name} x{thread_count}"
        seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - start
    seconds["cpu"] = time.process_time() - cpu
    return {"failures": failures, "seconds": seconds}


def test_cases_cover_every_registry_model() -> None:
    covered = {name for case in zoo_cases() for name in case.covers}
    assert covered | set(FULL_SIZE_ONLY) == set(available_models())


@pytest.mark.parametrize("world_size", [2, 3])
def test_data_parallel_trains_as_its_reference(world_size: int) -> None:
    results = run_ranks(world_size, _matrix, plan(), timeout=300,
                        env={TIMEOUT_ENV: os.environ.get(TIMEOUT_ENV, TIMEOUT_S)})
    failures = [f for result in results for f in result["failures"]]
    assert not failures, "\n".join(failures)
