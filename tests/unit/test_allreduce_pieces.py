"""The one rule for how an allreduce goes through the shared-memory windows
(:func:`scaledl.collectives.shm_ops.allreduce_pieces`), which the protocol runs and the cost
model prices: its edges, and that its pieces cover every message exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scaledl.collectives.shm_ops import (
    allreduce_pieces, direct_limit, stream_piece, tail_limit,
)

MIB = 1 << 20
WINDOW = 4 * MIB  # the default window: 2 MiB pieces, 1 MiB summed whole


def test_a_message_up_to_the_direct_limit_is_summed_whole() -> None:
    assert allreduce_pieces(MIB // 4, 4, WINDOW).split == 0
    assert allreduce_pieces(0, 4, WINDOW).split == 0


def test_one_element_past_the_direct_limit_streams_as_one_split_piece() -> None:
    numel = MIB // 4 + 1
    assert allreduce_pieces(numel, 4, WINDOW) == (2 * MIB // 4, numel)


def test_a_last_piece_up_to_half_a_piece_is_summed_whole_and_one_element_more_is_split() -> None:
    step = 2 * MIB // 4
    assert allreduce_pieces(3 * MIB // 4, 4, WINDOW) == (step, step)
    assert allreduce_pieces(3 * MIB // 4 + 1, 4, WINDOW) == (step, 3 * MIB // 4 + 1)
    assert allreduce_pieces(4 * MIB // 4, 4, WINDOW) == (step, 4 * MIB // 4)  # two full pieces


def test_half_precision_counts_bytes_not_elements() -> None:
    assert allreduce_pieces(MIB // 2, 2, WINDOW).split == 0
    assert allreduce_pieces(MIB // 2 + 1, 2, WINDOW) == (MIB, MIB // 2 + 1)


@settings(max_examples=300, deadline=None)
@given(numel=st.integers(0, 3 << 20), itemsize=st.sampled_from([1, 2, 4, 8]),
       window=st.sampled_from([64, 1000, 4096, 128 << 10, 1 << 20, 4 << 20, 8 << 20]))
def test_the_pieces_cover_the_message_and_no_full_piece_is_summed_whole(
    numel: int, itemsize: int, window: int
) -> None:
    step, split_end = allreduce_pieces(numel, itemsize, window)
    assert 0 <= split_end <= numel and step >= 1
    whole_bytes = (numel - split_end) * itemsize
    if split_end == 0:  # the message is summed whole: a small one, or a small last piece
        assert whole_bytes <= max(direct_limit(window), tail_limit(stream_piece(window)))
        return
    assert step == max(1, stream_piece(window) // itemsize)
    assert numel * itemsize > direct_limit(window)
    assert whole_bytes <= tail_limit(stream_piece(window))
    assert whole_bytes < step * itemsize or step == 1  # a full piece is always split
    if split_end < numel:  # the whole-summed rest is exactly the last piece
        assert split_end % step == 0
