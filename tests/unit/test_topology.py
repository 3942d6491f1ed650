"""Topology: parsing, coordinates, groups along axes, and layouts found from hosts or variables."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaledl.topology import TOPOLOGY_ENV, Topology, parse_axes

SHAPES = [(1,), (5,), (2, 2), (4, 2), (3, 2, 2), (2, 3, 1, 2), (1, 4)]


def _shuffled_order(world_size: int, seed: int) -> tuple[int, ...]:
    order = list(range(world_size))
    random.Random(seed).shuffle(order)
    return tuple(order)


def _layouts() -> list[Topology]:
    plain = [Topology(axes=axes) for axes in SHAPES]
    ordered = [Topology(axes=axes, order=_shuffled_order(math.prod(axes), 7)) for axes in SHAPES]
    return plain + ordered


# -- parsing --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "axes"), [("4x8x2", (4, 8, 2)), ("2*2", (2, 2)), (" 3X1 ", (3, 1)), ("7", (7,))]
)
def test_parse_axes(spec: str, axes: tuple[int, ...]) -> None:
    assert parse_axes(spec) == axes
    topology = Topology.parse(spec, math.prod(axes))
    assert topology.axes == axes and topology.explicit and topology.spec == "x".join(
        map(str, axes)
    )


@pytest.mark.parametrize("spec", ["", "0x2", "ax2", "2x", "2x-1", "2.5x2"])
def test_parse_rejects_bad_specs_naming_them(spec: str) -> None:
    with pytest.raises(ValueError, match=repr(spec).replace(".", r"\.").replace("*", r"\*")):
        parse_axes(spec)


def test_parse_product_mismatch_names_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"'2x2' describes 4 ranks but the world size is 6"):
        Topology.parse("2x2", world_size=6)


def test_parse_sets_rank() -> None:
    assert Topology.parse("2x3", 6, rank=5).rank == 5


def test_constructor_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="rank 4 is outside topology 2x2"):
        Topology(axes=(2, 2), rank=4)
    with pytest.raises(ValueError, match="order"):
        Topology(axes=(2, 2), order=(0, 1, 1, 3))
    with pytest.raises(ValueError, match="world size 0"):
        Topology.flat(0)


# -- coordinates ----------------------------------------------------------------------------------
@pytest.mark.parametrize("topology", _layouts(), ids=lambda t: f"{t.spec}-{t.order is not None}")
def test_coords_rank_at_round_trip(topology: Topology) -> None:
    seen = set()
    for rank in range(topology.world_size):
        coords = topology.coords(rank)
        assert all(0 <= c < size for c, size in zip(coords, topology.axes))
        assert topology.rank_at(coords) == rank
        seen.add(coords)
    assert len(seen) == topology.world_size


def test_default_layout_is_mixed_radix_innermost_first() -> None:
    topology = Topology(axes=(4, 8, 2))
    assert topology.coords(0) == (0, 0, 0)
    assert topology.coords(5) == (1, 1, 0)
    assert topology.coords(37) == (1, 1, 1)
    assert topology.rank_at((3, 7, 1)) == 63


def test_order_places_ranks_on_grid_positions() -> None:
    topology = Topology(axes=(2, 2), order=(0, 2, 1, 3))
    assert topology.rank_at((1, 0)) == 2
    assert topology.coords(1) == (0, 1)
    assert topology.node_ranks(0) == (0, 2)


@given(
    axes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    ordered=st.booleans(),
    data=st.data(),
)
def test_coords_round_trip_property(
    axes: list[int], seed: int, ordered: bool, data: st.DataObject
) -> None:
    world_size = math.prod(axes)
    order = _shuffled_order(world_size, seed) if ordered else None
    topology = Topology(axes=tuple(axes), order=order)
    rank = data.draw(st.integers(0, world_size - 1))
    coords = topology.coords(rank)
    assert topology.rank_at(coords) == rank
    node = 0
    for c, size in zip(reversed(coords[1:]), reversed(axes[1:])):
        node = node * size + c
    assert (topology.local_rank(rank), topology.node(rank)) == (coords[0], node)
    assert topology.node_ranks(node)[coords[0]] == rank


def test_rank_at_rejects_coordinates_outside() -> None:
    with pytest.raises(ValueError, match="do not fit topology 2x2"):
        Topology(axes=(2, 2)).rank_at((2, 0))
    with pytest.raises(ValueError, match="do not fit"):
        Topology(axes=(2, 2)).rank_at((0,))
    with pytest.raises(ValueError, match="rank 4 is outside"):
        Topology(axes=(2, 2)).coords(4)


# -- hosts and local ranks ------------------------------------------------------------------------
def test_node_and_local_rank() -> None:
    topology = Topology(axes=(4, 8, 2))
    assert (topology.ranks_per_node, topology.num_nodes) == (4, 16)
    assert [topology.node(r) for r in (0, 3, 4, 63)] == [0, 0, 1, 15]
    assert [topology.local_rank(r) for r in (0, 3, 4, 63)] == [0, 3, 0, 3]
    assert topology.node_ranks(1) == (4, 5, 6, 7)
    assert topology.node(4) == topology.node(7) != topology.node(3)
    with pytest.raises(ValueError, match="node 16 does not exist"):
        topology.node_ranks(16)


# -- groups along axes ----------------------------------------------------------------------------
@pytest.mark.parametrize("topology", _layouts(), ids=lambda t: f"{t.spec}-{t.order is not None}")
def test_axis_groups_partition_the_ranks(topology: Topology) -> None:
    for axis, size in enumerate(topology.axes):
        groups = topology.axis_groups(axis)
        members = sorted(itertools.chain.from_iterable(groups))
        assert members == list(range(topology.world_size))
        assert len(groups) == topology.world_size // size
        for group in groups:
            assert len(group) == size
            for rank in group:
                assert topology.axis_group(rank, axis) == group
                others = [c for i, c in enumerate(topology.coords(rank)) if i != axis]
                first = [c for i, c in enumerate(topology.coords(group[0])) if i != axis]
                assert others == first


def test_axis_group_is_ordered_by_coordinate() -> None:
    topology = Topology(axes=(2, 3))
    assert topology.axis_group(3, 0) == (2, 3)
    assert topology.axis_group(3, 1) == (1, 3, 5)
    with pytest.raises(ValueError, match="axis 2 does not exist"):
        topology.axis_group(0, 2)


def test_link_axis() -> None:
    topology = Topology(axes=(4, 8, 2))
    assert topology.link_axis(5, 5) == -1
    assert topology.link_axis(4, 7) == 0
    assert topology.link_axis(0, 4) == 1
    assert topology.link_axis(0, 32) == 2
    assert topology.link_axis(1, 36) == 2


# -- layouts from hosts and variables -------------------------------------------------------------
def test_from_hosts_block_layout() -> None:
    topology = Topology.from_hosts(["a", "a", "b", "b", "c", "c"], rank=3)
    assert (topology.axes, topology.order, topology.explicit, topology.rank) == (
        (2, 3), None, True, 3
    )


def test_from_hosts_round_robin_layout() -> None:
    topology = Topology.from_hosts(["a", "b", "a", "b"])
    assert topology.axes == (2, 2)
    assert topology.order == (0, 2, 1, 3)
    assert topology.node_ranks(0) == (0, 2) and topology.node_ranks(1) == (1, 3)
    assert topology.node(0) == topology.node(2) and topology.link_axis(0, 1) == 1


def test_from_hosts_single_host_is_flat() -> None:
    topology = Topology.from_hosts(["a"] * 4)
    assert topology.axes == (4,) and not topology.explicit


def test_from_hosts_uneven_hosts_is_an_error() -> None:
    with pytest.raises(ValueError, match=f"different numbers of ranks.*{TOPOLOGY_ENV}"):
        Topology.from_hosts(["a", "a", "b"])


def test_with_rank_keeps_layout() -> None:
    topology = Topology(axes=(2, 2), order=(0, 2, 1, 3), explicit=True)
    moved = topology.with_rank(3)
    assert (moved.axes, moved.order, moved.explicit, moved.rank) == ((2, 2), (0, 2, 1, 3), True, 3)
    assert str(moved) == "Topology(2x2, rank=3)"
