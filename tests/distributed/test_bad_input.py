"""What a user can get wrong with the collectives: clear errors on every rank, never a hang."""

from __future__ import annotations

import os

import pytest
import torch

import scaledl
from scaledl.topology import Topology
from tests.harness import RankFailure, run_ranks

pytestmark = pytest.mark.distributed


def _argument_errors(rank: int, world_size: int) -> list[str]:
    x = torch.ones(10)
    messages = []
    attempts = [
        lambda: scaledl.allreduce(x, algorithm="bogus"),
        lambda: scaledl.allreduce(x, algorithm="torus"),
        lambda: scaledl.allreduce(x, algorithm="hierarchical"),
        lambda: scaledl.allreduce(x, algorithm="ring", topology=Topology.parse("2x2")),
        lambda: scaledl.allreduce(x, op="product"),
        lambda: scaledl.allreduce(x.to(torch.uint8)),
        lambda: scaledl.broadcast(x, src=world_size),
        lambda: scaledl.reduce_scatter(torch.empty(3), torch.empty(7)),
        lambda: scaledl.allgather(torch.empty(3), torch.empty(7)),
        lambda: scaledl.reduce_scatter(torch.empty(3), torch.empty(6), algorithm="tree"),
        lambda: scaledl.reduce(x, dst="0"),  # type: ignore[arg-type]
        lambda: scaledl.allreduce(x, op=3),  # type: ignore[arg-type]
        lambda: scaledl.allreduce(x, algorithm=None),  # type: ignore[arg-type]
        lambda: scaledl.allreduce(x, topology="1x2"),  # type: ignore[arg-type]
    ]
    for attempt in attempts:
        try:
            attempt()
        except (ValueError, TypeError) as error:
            messages.append(str(error))
        else:
            messages.append("NO ERROR")
    # The group still works after all those refusals.
    scaledl.allreduce(x, algorithm="ring")
    assert torch.all(x == world_size)
    return messages


def test_argument_errors_raise_on_every_rank() -> None:
    per_rank = run_ranks(2, _argument_errors, timeout=60)
    assert per_rank[0] == per_rank[1]
    messages = per_rank[0]
    assert "NO ERROR" not in messages, messages
    assert "available for allreduce: auto, ring" in messages[0]
    assert "SCALEDL_TOPOLOGY" in messages[1] and "SCALEDL_TOPOLOGY" in messages[2]
    assert "describes 4 ranks but the group has 2" in messages[3]
    assert "product" in messages[4]
    assert "uint8" in messages[5]
    assert "outside the group of 2 ranks" in messages[6]
    assert "7 elements" in messages[7] and "world size (2) x shard (3) = 6" in messages[7]
    assert "does not implement reduce_scatter" in messages[9]
    # these failed deep inside (a comparison, an attribute) or, op=3, reduced with MIN
    assert "root rank (src or dst) must be an int, got str '0'" in messages[10]
    assert "unknown reduce op 3" in messages[11]
    assert "algorithm must be a name" in messages[12]
    assert "topology must be a scaledl.Topology" in messages[13]
    assert all("\n" not in m for m in messages)


def _mismatch(rank: int, world_size: int, kind: str) -> str:
    numel = 1000 + (rank if kind == "numel" else 0)
    dtype = torch.float64 if kind == "dtype" and rank == 1 else torch.float32
    try:
        scaledl.allreduce(torch.ones(numel, dtype=dtype), algorithm="ring")
    except ValueError as error:
        if os.environ.get("SCALEDL_DEBUG"):  # the call failed alone: the group goes on
            after = torch.ones(4)
            scaledl.allreduce(after, algorithm="ring")
            return f"{error} | then {after.tolist()}"
        return str(error)
    return "NO ERROR"


@pytest.mark.parametrize("kind", ["numel", "dtype"])
def test_mismatch_is_named_in_debug_mode(kind: str) -> None:
    messages = run_ranks(2, _mismatch, kind, timeout=60, env={"SCALEDL_DEBUG": "1"})
    assert messages[0] == messages[1]
    what = "element count" if kind == "numel" else "dtype"
    theirs = "1001 float32" if kind == "numel" else "1000 float64"
    for message in messages:
        assert message.startswith(f"ranks disagree on the {what} of allreduce: rank 0 called "
                                  "allreduce of 1000 float32 (sum, algorithm ring, layout 2")
        assert f"rank 1 called allreduce of {theirs}" in message
        assert message.endswith("| then [2.0, 2.0, 2.0, 2.0]")


def test_mismatch_without_debug_fails_fast_instead_of_hanging() -> None:
    # Gloo itself aborts the receiving process ("Received data size doesn't match expected
    # size"); the point here is that the job ends quickly, with no endless hang.
    with pytest.raises(RankFailure):
        run_ranks(2, _mismatch, "numel", timeout=45)


def _explain_alone(rank: int, world_size: int) -> str:
    scaledl.init()
    return scaledl.explain("allreduce", 1000)


def test_explain_on_one_rank_says_there_is_nothing_to_communicate() -> None:
    """It said 'auto chose ring' with every algorithm at 0.0 us."""
    [text] = run_ranks(1, _explain_alone, timeout=60)
    assert text.startswith("auto: a group of one rank has nothing to communicate"), text


def _wrap_on_rank_zero_only(rank: int, world_size: int) -> str:
    scaledl.init()  # as a user's script starts: every rank joins and agrees on the layout
    if rank != 0:
        return ""  # this rank leaves: its group closes and its peer's exchange fails
    try:
        scaledl.DataParallel(torch.nn.Linear(4, 4))
    except ValueError as error:
        return str(error)
    return "NO ERROR"


def test_a_wrap_that_only_one_rank_makes_is_named_not_a_transport_error() -> None:
    message = run_ranks(2, _wrap_on_rank_zero_only, timeout=60)[0]
    assert message.startswith("wrapping a model: the other ranks of the group did not make this "
                              "call (a peer closed its connection: it exited or crashed)"), message
