"""A shared-memory stage that moves no data still makes its round with every peer.

A rank may rewrite a call-word slot towards a peer two calls later only because every call
waits for something that peer writes in it (docs/algorithms.md, the invariants table).  A stage
over an empty slice reads no peer's data, so it must wait for the peers' announcements instead:
otherwise a fast rank runs it and announces its next call over the slot a late peer is about to
check, and the late peer fails a correct program with "called another collective".  No planner
makes such a stage today (empty calls plan no stages at all); the stage runner must not depend
on that.  Rank 1 is late at random at every step of the protocol, rank 0 never is."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from tests.harness import run_ranks

pytestmark = pytest.mark.distributed

ROUNDS = 10
KINDS = ("allreduce", "half", "broadcast", "reduce", "allgather", "reduce_scatter")


def _empty_stage(kind: str) -> None:
    from scaledl.collectives.communicator import communicator_for
    from scaledl.collectives.ops import ReduceOp
    from scaledl.collectives.schedule import Collective, Path, Stage

    paths = communicator_for(None).stages
    collective = {"half": Collective.ALLREDUCE}.get(kind) or Collective(kind)
    stage = Stage(collective, (0, 1), 0, 0, Path.SHM, root=0)
    dtype = torch.bfloat16 if kind == "half" else torch.float32
    if kind == "reduce_scatter":
        paths.scatter(stage, torch.empty(0), torch.empty(0), ReduceOp.SUM)
    elif kind == "allgather":
        paths.gather(stage, torch.empty(0), torch.empty(0))
    else:
        paths.run(stage, torch.empty(0, dtype=dtype), ReduceOp.SUM)


def _rounds(rank: int, world_size: int) -> list[Any]:
    if rank == 1:  # read when the group opens its shared memory, at the first call
        os.environ["SCALEDL_SHM_JITTER"] = "21:3:0.5"
    import scaledl

    results = []
    for round_ in range(ROUNDS):
        for kind in KINDS:
            first = torch.full((1000,), float(rank + 1))
            scaledl.allreduce(first)
            _empty_stage(kind)
            second = torch.full((1000,), float(round_))
            scaledl.allreduce(second)
            results.append((first[0].item(), second[0].item()))
    return results


def test_an_empty_stage_between_two_calls_keeps_a_late_peer_in_step() -> None:
    env = {"SCALEDL_TIMEOUT": "20", "SCALEDL_SHM_WINDOW_MB": "0.125"}
    results = run_ranks(2, _rounds, timeout=120, env=env)
    expected = [(3.0, 2.0 * round_) for round_ in range(ROUNDS) for _ in KINDS]
    assert results == [expected, expected]
