"""The one call signature: its encodings round-trip, every field it compares is compared, and a
mismatch names both sides (checked on an in-process exchange of several simulated ranks)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scaledl.signature import (
    DTYPES, OPS, ROW_LENGTH, CallMismatch, Kind, Row, Signature, settle,
)


def _judge(signatures: Sequence[Signature], **options: object) -> list[str | list[Row]]:
    """Run settle() as every rank would, the text round served by the same simulated ranks."""
    rows = [s.encode() for s in signatures]

    def exchange(values: Sequence[int]) -> list[list[int]]:
        return [_text_words(s, len(values)) for s in signatures]

    outcomes: list[str | list[Row]] = []
    for mine in signatures:
        try:
            outcomes.append(settle(mine, rows, exchange, **options))  # type: ignore[arg-type]
        except CallMismatch as error:
            outcomes.append(str(error))
    return outcomes


def _text_words(sig: Signature, words: int) -> list[int]:
    blob = b"".join((t or "").encode() for t in sig.texts())
    padded = blob + bytes(words * 8 - len(blob))
    return torch.frombuffer(bytearray(padded), dtype=torch.int64).tolist() if words else []


ALLREDUCE = Signature(Kind.ALLREDUCE, 1000, torch.float32, "sum", algorithm="ring", layout="2x2")


@pytest.mark.parametrize("other, field, theirs", [
    (Signature(Kind.ALLREDUCE, 998, torch.float32, "sum", algorithm="ring", layout="2x2"),
     "element count", "allreduce of 998 float32"),
    (Signature(Kind.ALLREDUCE, 1000, torch.float64, "sum", algorithm="ring", layout="2x2"),
     "dtype", "1000 float64"),
    (Signature(Kind.ALLREDUCE, 1000, torch.float32, "max", algorithm="ring", layout="2x2"),
     "reduction op", "(max, algorithm ring"),
    (Signature(Kind.ALLREDUCE, 1000, torch.float32, "sum", algorithm="tree", layout="2x2"),
     "algorithm", "algorithm tree"),
    (Signature(Kind.ALLREDUCE, 1000, torch.float32, "sum", algorithm="ring", layout="4"),
     "layout", "layout 4)"),
    (Signature(Kind.BROADCAST, 1000, torch.float32, root=1, algorithm="ring", layout="2x2"),
     "call", "broadcast of 1000 float32 (root 1"),
])
def test_each_field_is_compared_and_both_sides_are_named(
    other: Signature, field: str, theirs: str
) -> None:
    outcomes = _judge([ALLREDUCE, ALLREDUCE, other], ranks=[4, 5, 6])
    assert len(set(map(str, outcomes))) == 1, "every rank must raise the same message"
    message = str(outcomes[0])
    assert message.startswith(f"ranks disagree on the {field} of allreduce: rank 4 called "
                              "allreduce of 1000 float32 (sum, algorithm ring, layout 2x2)")
    assert theirs in message.split("but rank 6 called ")[1]


def test_matching_calls_return_every_row_and_the_data_is_not_compared() -> None:
    calls = [Signature(Kind.OPEN_GROUP, layout="2x2", data=(100 + r, 7)) for r in range(3)]
    for outcome in _judge(calls):
        assert isinstance(outcome, list)
        assert [row.data for row in outcome] == [(100, 7), (101, 7), (102, 7)]


def test_a_problem_on_one_rank_is_raised_on_every_rank_in_its_words() -> None:
    calls = [Signature(Kind.BROADCAST, 4, torch.float32, root=0),
             Signature(Kind.BROADCAST, 4, torch.float32, root=0,
                       problem="passed a root outside the group")]
    outcomes = _judge(calls, ranks=[0, 3])
    assert outcomes == ["broadcast: rank 3 passed a root outside the group"] * 2


def test_details_differ_by_their_first_differing_line() -> None:
    calls = [Signature(Kind.WRAP_MODEL, detail="parameter w (2, 2) float32\nbuffer b (2,) int64"),
             Signature(Kind.WRAP_MODEL, detail="parameter w (2, 2) float32\nbuffer b (3,) int64")]
    message = str(_judge(calls, fix="build the same model")[1])
    assert message == ("ranks disagree on the details of wrapping a model: entry 1 is 'buffer b "
                       "(2,) int64' on rank 0 but 'buffer b (3,) int64' on rank 1; build the same "
                       "model")


def test_allgather_shapes_may_differ_in_the_first_dimension_only() -> None:
    def gather(*shape: int) -> Signature:
        return Signature(Kind.ALLGATHER, dtype=torch.float32, shape=shape, name="x")

    assert isinstance(_judge([gather(2, 3), gather(5, 3)])[0], list)
    mismatched = str(_judge([gather(2, 3), gather(2, 4)])[0])
    assert "ranks disagree on the shape of allgather" in mismatched


def test_ranks_outside_the_comparison_are_not_compared() -> None:
    calls = [Signature(Kind.JOIN, data=(3,)), Signature(Kind.ALLREDUCE, 4, torch.float32, "sum"),
             Signature(Kind.ALLREDUCE, 4, torch.float32, "sum")]
    assert all(isinstance(o, list) for o in _judge(calls, compare=[1, 2]))


@given(kind=st.sampled_from(list(Kind)), numel=st.integers(0, (1 << 39) - 1),
       dtype=st.sampled_from((None, *DTYPES)), op=st.sampled_from((None, *OPS)),
       root=st.integers(-1, 1021))
def test_the_packed_word_round_trips(kind: Kind, numel: int, dtype: torch.dtype | None,
                                     op: str | None, root: int) -> None:
    sig = Signature(kind, numel, dtype, op, root)
    word = sig.word()
    assert 0 <= word < 1 << 63
    back = Signature.from_word(word)
    assert (back.kind, back.numel, back.dtype, back.op, back.root) == (kind, numel, dtype, op,
                                                                       root)


@given(shape=st.lists(st.integers(0, 9), max_size=9), name=st.none() | st.text(max_size=20))
def test_the_row_round_trips(shape: list[int], name: str | None) -> None:
    sig = Signature(Kind.ALLGATHER, dtype=torch.int8, shape=tuple(shape), name=name,
                    data=(5, -6))
    row = Row(tuple(sig.encode()))
    assert len(row.values) == ROW_LENGTH
    back = row.signature(sig.texts())
    assert back.numel == sig.numel and back.data == (5, -6) and back.name == name
    if len(shape) <= 6:
        assert back.shape == tuple(shape)
    assert back.describe() == sig.describe() or len(shape) > 6


def test_an_unknown_op_is_refused() -> None:
    with pytest.raises(ValueError, match="reduction op 'mean' is none of"):
        Signature(Kind.ALLREDUCE, op="mean")
