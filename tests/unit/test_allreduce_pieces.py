"""The one rule for how an allreduce goes through the shared-memory windows
(:func:`scaledl.collectives.shm_ops.allreduce_pieces`), which the protocol runs and the cost
model prices: its edges, and that it runs, for every non-empty message, exactly the pieces the
protocol ran before the rule was one function (an empty message plans no stage; an empty stage
waits for the peers' announcements instead, tests/distributed/test_shm_empty_calls.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaledl.collectives.shm_ops import (
    allreduce_pieces, direct_limit, stream_piece, tail_limit,
)

MIB = 1 << 20
WINDOW = 4 * MIB  # the default window: 2 MiB pieces, 1 MiB summed whole


def test_a_message_up_to_the_direct_limit_is_summed_whole() -> None:
    assert allreduce_pieces(MIB // 4, 4, WINDOW).split == 0


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


def _pieces_before(numel: int, itemsize: int, window: int) -> list[tuple[int, int, bool]]:
    """The pieces as the tensor path computed them before the rule was one function (each
    piece whole when the message fits :func:`direct_limit` or the piece fits
    :func:`tail_limit`): the oracle the rule must match."""
    piece_bytes = stream_piece(window)
    whole = numel * itemsize <= direct_limit(window)
    step = max(1, piece_bytes // itemsize)
    return [(a, min(numel, a + step),
             whole or (min(numel, a + step) - a) * itemsize <= tail_limit(piece_bytes))
            for a in range(0, numel, step)]


def _pieces_now(numel: int, itemsize: int, window: int) -> list[tuple[int, int, bool]]:
    step, split_end = allreduce_pieces(numel, itemsize, window)
    split_pieces = [(a, min(split_end, a + step), False) for a in range(0, split_end, step)]
    return split_pieces + ([(split_end, numel, True)] if split_end < numel else [])


WINDOWS = (4096, 128 << 10, 1 << 20, 4 << 20, 8 << 20)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("window", WINDOWS)
def test_the_rule_runs_the_pieces_the_protocol_always_ran_at_every_edge(
    itemsize: int, window: int
) -> None:
    piece = stream_piece(window)
    edges = {direct_limit(window), piece, piece + tail_limit(piece), 2 * piece,
             3 * piece + tail_limit(piece), 5 * piece}
    for edge_bytes in edges:
        for numel in (edge_bytes // itemsize - 1, edge_bytes // itemsize,
                      edge_bytes // itemsize + 1):
            assert _pieces_now(numel, itemsize, window) == _pieces_before(
                numel, itemsize, window), (numel, itemsize, window)


@settings(max_examples=300, deadline=None)
@given(numel=st.integers(1, 3 << 20), itemsize=st.sampled_from([2, 4, 8]),
       window=st.sampled_from(WINDOWS))
def test_the_rule_matches_the_protocol_before_it_for_any_message(
    numel: int, itemsize: int, window: int
) -> None:
    assert _pieces_now(numel, itemsize, window) == _pieces_before(numel, itemsize, window)
