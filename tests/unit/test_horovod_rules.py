"""scaledl.horovod's rules without processes: algorithm choice, reduce ops, reduce-scatter
slices, the negotiation rows and their verdicts, and scaledl run's host lists."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from scaledl.cli.run import local_slots, parse_hosts
from scaledl.horovod.errors import UnsupportedError
from scaledl.horovod.negotiation import Agreement, Kind, Problem, Request, judge
from scaledl.horovod.reduce_ops import Adasum, Average, Max, Min, Sum, identity, resolve_op
from scaledl.horovod.reducescatter import slice_rows
from scaledl.horovod.runtime import STEP_NEGOTIATION_ENV, Algorithms, step_negotiation


def test_one_algorithm_applies_where_it_exists_and_pairs_name_each_collective() -> None:
    ring = Algorithms.parse("ring")
    assert (ring.allreduce, ring.broadcast, ring.allgather, ring.reduce_scatter) == \
        ("ring", "auto", "ring", "ring")
    assert Algorithms.parse(" ").describe() == \
        "allreduce=auto broadcast=auto allgather=auto reduce_scatter=auto"
    pairs = Algorithms.parse("allreduce=tree, broadcast=chain, reducescatter=halving_doubling")
    assert (pairs.allreduce, pairs.broadcast, pairs.reduce_scatter) == \
        ("tree", "chain", "halving_doubling")
    with pytest.raises(ValueError, match="'bogus' is not a scaledl algorithm"):
        Algorithms.parse("bogus")
    with pytest.raises(ValueError, match="does not implement broadcast"):
        Algorithms.parse("broadcast=ring")
    with pytest.raises(ValueError, match="COLLECTIVE=NAME"):
        Algorithms.parse("alltoall=ring")


def test_reduce_ops_follow_horovod() -> None:
    assert resolve_op(None) is Average and resolve_op(Sum) is Sum
    with pytest.warns(DeprecationWarning):
        assert resolve_op(None, average=False) is Sum
    with pytest.raises(ValueError, match="not both"):
        resolve_op(Sum, average=True)
    with pytest.raises(UnsupportedError, match="Adasum"):
        resolve_op(Adasum)
    with pytest.raises(ValueError, match="unknown reduce op 'sum'"):
        resolve_op("sum")
    assert identity(Min, torch.float32) == float("inf") and identity(Max, torch.int32) == -2**31
    assert identity(Average, torch.float16) == 0


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 100])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_reducescatter_slices_tile_the_rows_extra_rows_first(rows: int, size: int) -> None:
    slices = [slice_rows(rows, size, r) for r in range(size)]
    assert sum(count for _, count in slices) == rows
    assert all(slices[r][0] + slices[r][1] == slices[r + 1][0] for r in range(size - 1))
    assert [count for _, count in slices] == sorted((count for _, count in slices), reverse=True)


def _rows(*requests: Request) -> Agreement:
    """The agreement rank 0 reaches (every rank reaches the same one), the text round of a
    failure served from the same simulated ranks."""
    signatures = [r.signature() for r in requests]

    def exchange(values: Sequence[int]) -> list[list[int]]:
        words = []
        for sig in signatures:
            blob = b"".join((t or "").encode() for t in sig.texts())
            blob += bytes(len(values) * 8 - len(blob))
            words.append(torch.frombuffer(bytearray(blob), dtype=torch.int64).tolist())
        return words

    return judge(signatures[0], [s.encode() for s in signatures], exchange,
                 tuple(range(len(requests))))


def test_rows_carry_the_shape_and_a_digest_of_extra_dimensions() -> None:
    request = Request(Kind.ALLGATHER, "x", torch.int16, (2, 3, 1, 1, 1, 4, 5), op=1, root=0)
    row = _rows(request).rows[0]
    assert (row.kind, row.ndim, row.numel) == (Kind.ALLGATHER, 7, 120)
    assert row.dims[:5] == (2, 3, 1, 1, 1)
    assert row.signature([None, None, "x", None, None]).describe().startswith(
        "allgather 'x' of shape [2, 3, 1, 1, 1, -1, -1] int16")


def test_shapes_that_differ_beyond_the_sixth_dimension_are_a_mismatch() -> None:
    # the sixth slot holds a digest of the rest: [..., 2, 3] and [..., 3, 2] differ
    for kind in (Kind.ALLREDUCE, Kind.ALLGATHER):
        a = Request(kind, None, torch.float32, (1, 1, 1, 1, 1, 2, 3), op=0)
        b = Request(kind, None, torch.float32, (1, 1, 1, 1, 1, 3, 2), op=0)
        assert _rows(a, a).verdict() is None
        assert f"ranks disagree on the shape of {kind.value}" in (_rows(a, b).verdict() or "")


def test_verdicts_name_the_first_mismatch_the_same_way_everywhere() -> None:
    a = Request(Kind.ALLREDUCE, None, torch.float32, (2, 3), op=0)
    assert _rows(a, a, a).verdict() is None
    assert _rows(a, Request(Kind.ALLREDUCE, None, torch.float32, (3, 2), op=0)).verdict() == (
        "ranks disagree on the shape of allreduce: rank 0 called allreduce of shape [2, 3] "
        "float32 (avg) but rank 1 called allreduce of shape [3, 2] float32 (avg); collectives "
        "are matched by call order, so every rank must issue them in the same order with the "
        "same arguments")
    gather = Request(Kind.ALLGATHER, None, torch.float32, (2, 3))
    assert _rows(gather, Request(Kind.ALLGATHER, None, torch.float32, (5, 3))).verdict() is None
    bad = Request(Kind.ALLTOALL, None, torch.float32, (4,), problem=Problem.SPLITS_LENGTH)
    assert "alltoall: rank 1 passed splits whose length" in (_rows(a, bad).verdict() or "")
    joined = Request(Kind.JOIN)
    assert _rows(joined, a).verdict() is None
    assert "cannot run while ranks [0] are in hvd.join()" in \
        (_rows(joined, gather, gather).verdict() or "")
    assert _rows(joined, joined).verdict() is None and not _rows(joined, joined).active


def test_host_lists() -> None:
    assert parse_hosts("localhost:2, 127.0.0.1") == [("localhost", 2), ("127.0.0.1", 1)]
    assert local_slots(parse_hosts("localhost:2,127.0.0.1:2")) == 4
    assert local_slots([("LOCALHOST", 2)]) == 2  # host names know no case
    with pytest.raises(ValueError, match="'a:0' is not HOST or HOST:SLOTS"):
        parse_hosts("a:0")
    with pytest.raises(ValueError, match="'gpu9' is not this machine"):
        local_slots([("gpu9", 4)])


def test_step_negotiation_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STEP_NEGOTIATION_ENV, raising=False)
    assert step_negotiation()
    monkeypatch.setenv(STEP_NEGOTIATION_ENV, "0")
    assert not step_negotiation()
    monkeypatch.setenv(STEP_NEGOTIATION_ENV, "off")
    with pytest.raises(ValueError, match="must be 1 .default. or 0"):
        step_negotiation()
