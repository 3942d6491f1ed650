"""ShardedSampler (coverage, tails, determinism, resume); ShardedLoader (order, prefetch thread)."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from scaledl.data import ArrayDataset, ShardedLoader, ShardedSampler, batches_per_epoch


def _shards(
    num_samples: int, world_size: int, epoch: int = 0, seed: int = 0, **kwargs: bool
) -> list[list[int]]:
    shards = []
    for rank in range(world_size):
        sampler = ShardedSampler(num_samples, rank, world_size, seed=seed, **kwargs)
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


def _check_partition(num_samples: int, world_size: int, shards: list[list[int]]) -> None:
    per_rank = math.ceil(num_samples / world_size)
    assert all(len(shard) == per_rank for shard in shards)
    flat = [index for shard in shards for index in shard]
    assert set(flat) == set(range(num_samples))
    assert len(flat) - len(set(flat)) == per_rank * world_size - num_samples


# -- coverage and tails ---------------------------------------------------------------------------
@pytest.mark.parametrize("num_samples", [1, 5, 12, 13, 100])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_padded_shards_cover_everything(num_samples: int, world_size: int) -> None:
    shards = _shards(num_samples, world_size)
    _check_partition(num_samples, world_size, shards)
    if num_samples % world_size == 0:
        flat = [index for shard in shards for index in shard]
        assert len(flat) == len(set(flat)) == num_samples


def test_padding_wraps_to_the_start_of_the_permutation() -> None:
    sampler = ShardedSampler(10, 0, 4, seed=3)
    order = sampler.global_indices()
    assert len(order) == 12 and order[10:].tolist() == order[:2].tolist()
    tiny = ShardedSampler(2, 0, 5, seed=3).global_indices().tolist()
    assert tiny == (tiny[:2] * 3)[:5]


@pytest.mark.parametrize(("num_samples", "world_size"), [(10, 4), (12, 4), (7, 3), (5, 5)])
def test_drop_last_truncates_to_whole_rounds(num_samples: int, world_size: int) -> None:
    shards = _shards(num_samples, world_size, drop_last=True)
    kept = num_samples // world_size
    assert all(len(shard) == kept for shard in shards)
    flat = [index for shard in shards for index in shard]
    assert len(set(flat)) == len(flat) == kept * world_size
    order = ShardedSampler(num_samples, 0, world_size, drop_last=True).global_indices()
    assert set(flat) == set(order.tolist())


def test_ranks_interleave_one_global_order() -> None:
    order = ShardedSampler(11, 0, 3, seed=5).global_indices().tolist()
    shards = _shards(11, 3, seed=5)
    assert [shards[k % 3][k // 3] for k in range(12)] == order


def test_no_shuffle_is_strided_identity() -> None:
    assert _shards(7, 2, shuffle=False) == [[0, 2, 4, 6], [1, 3, 5, 0]]


@settings(max_examples=60, deadline=None)
@given(
    num_samples=st.integers(1, 300),
    world_size=st.integers(1, 17),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 50),
)
def test_property_coverage(num_samples: int, world_size: int, seed: int, epoch: int) -> None:
    _check_partition(num_samples, world_size, _shards(num_samples, world_size, epoch, seed))


# -- determinism ----------------------------------------------------------------------------------
def test_same_seed_and_epoch_same_order_other_epoch_or_seed_differs() -> None:
    assert _shards(50, 2, epoch=3, seed=9) == _shards(50, 2, epoch=3, seed=9)
    assert _shards(50, 2, epoch=3, seed=9) != _shards(50, 2, epoch=4, seed=9)
    assert _shards(50, 2, epoch=3, seed=9) != _shards(50, 2, epoch=3, seed=10)
    # (seed, epoch) pairs are mixed, not added: (0, 1) and (1, 0) differ.
    assert _shards(50, 1, epoch=1, seed=0) != _shards(50, 1, epoch=0, seed=1)


def test_set_epoch_wins_and_starts_its_epoch_over() -> None:
    """set_epoch(e) makes the next pass read epoch e whole, even e just read or left mid-way
    (as torch's DistributedSampler re-reads it); the position is kept only after a restore."""
    sampler = ShardedSampler(20, 0, 2)
    sampler.advance(4)
    sampler.set_epoch(0)
    assert (sampler.epoch, sampler.position) == (0, 0)
    sampler.set_epoch(1)
    first = list(sampler)
    assert sampler.position == 0 and sampler.epoch == 1 and len(first) == 10
    sampler.advance(len(sampler))
    sampler.set_epoch(1)
    assert list(sampler) == first
    sampler.advance(len(sampler))
    sampler.rewind()
    assert list(sampler) == first and sampler.epoch == 1


def test_a_finished_epoch_moves_on_without_set_epoch() -> None:
    sampler = ShardedSampler(20, 0, 2, seed=3)
    epochs = []
    for _ in range(3):
        epochs.append(list(sampler))
        sampler.advance(len(sampler))
    assert [len(e) for e in epochs] == [10, 10, 10] and sampler.epoch == 2
    assert len({tuple(e) for e in epochs}) == 3
    assert epochs[1] == _shards(20, 2, epoch=1, seed=3)[0]
    sampler.set_epoch(5)
    sampler.advance(3)
    assert list(sampler) == _shards(20, 2, epoch=5, seed=3)[0][3:] and sampler.epoch == 5


def test_set_epoch_rejects_a_non_integer() -> None:
    with pytest.raises(TypeError, match="epoch must be an int, got '1'"):
        ShardedSampler(20, 0, 2).set_epoch("1")  # type: ignore[arg-type]


# -- resume ---------------------------------------------------------------------------------------
def test_resume_mid_epoch_yields_exactly_the_rest() -> None:
    sampler = ShardedSampler(23, 1, 3, seed=4)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.advance(5)
    state = sampler.state_dict()
    assert state == {"epoch": 2, "position": 5, "offset": 0, "seed": 4, "num_samples": 23,
                     "world_size": 3}
    resumed = ShardedSampler(23, 1, 3, seed=4)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert list(resumed) == full[5:]


@pytest.mark.parametrize(("old_world", "new_world", "num_samples"),
                         [(4, 2, 40), (4, 3, 40), (2, 5, 40), (3, 3, 40), (3, 2, 36), (3, 2, 37)])
def test_resume_with_another_world_size_continues_exactly(
    old_world: int, new_world: int, num_samples: int
) -> None:
    """The new ranks share exactly the rest of the epoch's order: nothing read twice or skipped
    (apart from the padding of the rest's uneven tail, which wraps to the start of the order)."""
    consumed_per_rank = 3
    old = ShardedSampler(num_samples, 0, old_world, seed=1)
    old.set_epoch(6)
    order = old.global_indices().tolist()[:num_samples]  # the permutation
    old.advance(consumed_per_rank)
    state = old.state_dict()
    rest = []
    for rank in range(new_world):
        new = ShardedSampler(num_samples, rank, new_world, seed=1)
        new.load_state_dict(state)
        resized = new_world != old_world
        assert new.epoch == 6
        assert (new.offset, new.position) == ((consumed_per_rank * old_world, 0) if resized
                                              else (0, consumed_per_rank))
        rest.append(list(new))
    start = new.offset + new.position * new_world
    interleaved = [rest[k % new_world][k // new_world] for k in range(sum(map(len, rest)))]
    assert start == consumed_per_rank * old_world
    assert interleaved[: num_samples - start] == order[start:]
    assert interleaved[num_samples - start:] == order[: len(interleaved) - num_samples + start]
    assert len(interleaved) - (num_samples - start) < new_world


def test_a_second_resize_continues_from_the_offset() -> None:
    first = ShardedSampler(30, 0, 3, seed=2)
    first.advance(2)  # 6 samples read by 3 ranks
    second = [ShardedSampler(30, r, 2, seed=2) for r in range(2)]
    for sampler in second:
        sampler.load_state_dict(first.state_dict())
        sampler.advance(4)  # 8 more by 2 ranks
    third = ShardedSampler(30, 0, 4, seed=2)
    third.load_state_dict(second[0].state_dict())
    assert third.offset == 14 and len(third) == 4
    same = ShardedSampler(30, 1, 2, seed=2)
    same.load_state_dict(second[0].state_dict())  # same world size: offset and position kept
    assert (same.offset, same.position) == (6, 4)
    third.set_epoch(1)
    assert third.offset == 0 and len(third) == 8


def test_load_state_dict_rejects_another_dataset_or_seed() -> None:
    state = ShardedSampler(10, 0, 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="num_samples=10 but this sampler has num_samples=11"):
        ShardedSampler(11, 0, 2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=1 but this sampler has seed=2"):
        ShardedSampler(10, 0, 2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="lacks \\['position'\\]"):
        ShardedSampler(10, 0, 2, seed=1).load_state_dict(
            {k: v for k, v in state.items() if k != "position"}
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10, 2, 2), "rank 2 is outside 0..1 for world_size 2"),
        ((10, -1, 2), "rank -1 is outside"),
        ((10, 0, 0), "world_size 0 must be >= 1"),
        ((0, 0, 1), "num_samples 0 must be >= 1"),
    ],
)
def test_constructor_errors_name_the_value(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardedSampler(*args)


def test_other_errors() -> None:
    with pytest.raises(ValueError, match="drop_last with 2 samples on 3 ranks"):
        ShardedSampler(2, 0, 3, drop_last=True)
    sampler = ShardedSampler(10, 0, 2)
    with pytest.raises(ValueError, match="cannot advance position 0 by 6"):
        sampler.advance(6)
    with pytest.raises(ValueError, match="epoch -1"):
        sampler.set_epoch(-1)


# -- loader ---------------------------------------------------------------------------------------
def _dataset(num_samples: int = 37) -> ArrayDataset:
    features = torch.arange(num_samples * 4, dtype=torch.float32).reshape(num_samples, 1, 2, 2)
    return ArrayDataset(features, torch.arange(num_samples) % 5, 5, "ramp")


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_loader_batches_follow_the_sampler(prefetch: int) -> None:
    dataset = _dataset()
    sampler = ShardedSampler(len(dataset), 1, 3, seed=2)
    expected = list(sampler)
    loader = ShardedLoader(dataset, 5, sampler, prefetch=prefetch)
    batches = list(loader)
    assert len(batches) == len(loader) == math.ceil(13 / 5)
    got = torch.cat([labels for _, labels in batches]).tolist()
    assert got == [dataset.labels[i].item() for i in expected]
    firsts = torch.cat([features[:, 0, 0, 0] for features, _ in batches]) / 4
    assert firsts.long().tolist() == expected
    assert sampler.position == len(sampler)


@pytest.mark.parametrize(("num_samples", "world_size", "batch_size", "drop_last"),
                         [(90, 2, 2, False), (37, 3, 5, False), (37, 3, 5, True), (22, 4, 2, True)])
def test_a_plain_epoch_loop_reads_every_epoch_like_torch(
    num_samples: int, world_size: int, batch_size: int, drop_last: bool
) -> None:
    """The README loop without set_epoch: every pass is a whole epoch in a new order (it read
    [45, 0, 0] batches), ranks disjoint and covering, as many batches as torch's DataLoader
    over a DistributedSampler."""
    dataset = _dataset(num_samples)
    loaders = [
        ShardedLoader(dataset, batch_size,
                      ShardedSampler(num_samples, rank, world_size, seed=4, drop_last=drop_last),
                      prefetch=rank % 2, drop_last=drop_last)
        for rank in range(world_size)
    ]
    torch_loaders = [
        torch.utils.data.DataLoader(
            dataset.labels, batch_size=batch_size, drop_last=drop_last,
            sampler=torch.utils.data.DistributedSampler(
                dataset.labels, world_size, rank, seed=4, drop_last=drop_last))
        for rank in range(world_size)
    ]
    orders = []
    for epoch in range(3):
        shards = []
        for loader, reference in zip(loaders, torch_loaders, strict=True):
            reference.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            batches = [features[:, 0, 0, 0].long() // 4 for features, _ in loader]
            assert len(batches) == len(loader) == len(reference) > 0
            assert [len(b) for b in batches] == [len(b) for b in reference]
            assert loader.sampler.epoch == epoch
            shards.append(torch.cat(batches).tolist())
        flat = [index for shard in shards for index in shard]
        if drop_last:  # disjoint; only the tails are left out
            assert len(set(flat)) == len(flat) > num_samples - world_size * (batch_size + 1)
        else:  # covering; only the wrap-around padding is read twice
            assert set(flat) == set(range(num_samples))
            assert len(flat) - num_samples == len(shards[0]) * world_size - num_samples
        orders.append(flat)
    assert len({tuple(order) for order in orders}) == 3


def test_loader_drop_last_and_tensor_dataset() -> None:
    data = TensorDataset(torch.arange(20.0), torch.arange(20))
    loader = ShardedLoader(data, 3, ShardedSampler(20, 0, 2), drop_last=True)
    assert len(loader) == 3 and [len(b[0]) for b in loader] == [3, 3, 3]


def test_loader_position_resumes_at_the_exact_sample() -> None:
    dataset = _dataset()
    sampler = ShardedSampler(len(dataset), 0, 2, seed=8)
    everything = torch.cat([labels for _, labels in ShardedLoader(dataset, 4, sampler)])
    sampler.rewind()
    seen = []
    for index, (_, labels) in enumerate(ShardedLoader(dataset, 4, sampler, prefetch=2)):
        seen.append(labels)
        if index == 1:
            break
    state = sampler.state_dict()
    assert state["position"] == 8
    resumed = ShardedSampler(len(dataset), 0, 2, seed=8)
    resumed.load_state_dict(state)
    rest = [labels for _, labels in ShardedLoader(dataset, 4, resumed)]
    assert torch.equal(torch.cat(seen + rest), everything)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_resumed_finished_epoch_yields_no_batch(prefetch: int) -> None:
    """A checkpoint taken after an epoch's last batch resumes with nothing left of the epoch:
    set_epoch(that epoch) gives no batch at all (an empty batch would be one training step
    more); a plain loop without set_epoch goes on with the next epoch, as the run it resumes
    would have."""
    dataset = _dataset()
    sampler = ShardedSampler(len(dataset), 0, 2, seed=8)
    assert len(list(ShardedLoader(dataset, 4, sampler))) > 0
    resumed = ShardedSampler(len(dataset), 0, 2, seed=8)
    resumed.load_state_dict(sampler.state_dict())
    resumed.set_epoch(0)
    loader = ShardedLoader(dataset, 4, resumed, prefetch=prefetch)
    assert loader.batch_indices() == [] and list(loader) == []
    plain = ShardedSampler(len(dataset), 0, 2, seed=8)
    plain.load_state_dict(sampler.state_dict())
    loader = ShardedLoader(dataset, 4, plain, prefetch=prefetch)
    expected = loader.batch_indices()
    assert [labels.tolist() for _, labels in loader] == [
        dataset.labels[indices].tolist() for indices in expected]
    assert plain.epoch == 1 and len(expected) == len(loader)
    original = ShardedLoader(dataset, 4, sampler)
    assert [t.tolist() for t in original.batch_indices()] == [t.tolist() for t in expected]


@pytest.mark.parametrize("drop_last", [False, True])
def test_mid_epoch_resume_of_a_plain_loop_is_bitwise(drop_last: bool) -> None:
    """Checkpoints after every batch of a 3-epoch plain loop (no set_epoch): each resumed
    loader reads exactly what the uninterrupted one read from there on."""
    dataset = _dataset()
    sampler = ShardedSampler(len(dataset), 1, 3, seed=6, drop_last=drop_last)
    loader = ShardedLoader(dataset, 4, sampler, prefetch=1, drop_last=drop_last)
    read: list[list[int]] = []
    states = [sampler.state_dict()]
    for _ in range(3):
        for _, labels in loader:
            read.append(labels.tolist())
            states.append(sampler.state_dict())
    assert len(read) == 3 * len(loader)
    for done, state in enumerate(states[:-1]):
        resumed = ShardedSampler(len(dataset), 1, 3, seed=6, drop_last=drop_last)
        resumed.load_state_dict(state)
        again = ShardedLoader(dataset, 4, resumed, prefetch=0, drop_last=drop_last)
        rest: list[list[int]] = []
        while done + len(rest) < len(read):
            rest += [labels.tolist() for _, labels in again]
        assert read[:done] + rest == read


def _wait_for_threads(baseline: int) -> int:
    deadline = time.monotonic() + 5
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count()


def test_prefetch_thread_stops_when_iteration_stops_early() -> None:
    baseline = threading.active_count()
    dataset = _dataset(400)
    loader = ShardedLoader(dataset, 2, ShardedSampler(400, 0, 1), prefetch=2)
    for index, _ in enumerate(loader):
        if index == 3:
            break
    assert _wait_for_threads(baseline) == baseline
    iterator = iter(loader)
    next(iterator)
    assert threading.active_count() == baseline + 1
    iterator.close()
    assert threading.active_count() == baseline
    with pytest.raises(StopIteration):
        next(iterator)
    list(loader)
    assert _wait_for_threads(baseline) == baseline


class _FailingLabels:
    """Duck-types a label tensor whose second gather raises."""

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        return 10

    def index_select(self, dim: int, indices: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("disk on fire")
        return indices


class _FailingDataset:
    def __init__(self) -> None:
        self.features = torch.zeros(10, 3)
        self.labels = _FailingLabels()


def test_exception_in_the_prefetch_thread_reaches_the_consumer() -> None:
    baseline = threading.active_count()
    loader = ShardedLoader(_FailingDataset(), 4, ShardedSampler(10, 0, 1), prefetch=2)
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(RuntimeError, match="disk on fire"):
        next(iterator)
    assert _wait_for_threads(baseline) == baseline
    with pytest.raises(StopIteration):
        next(iterator)


def test_loader_errors() -> None:
    dataset = _dataset(10)
    with pytest.raises(ValueError, match="batch_size 0 must be >= 1"):
        ShardedLoader(dataset, 0, ShardedSampler(10, 0, 1))
    with pytest.raises(ValueError, match="sampler covers 11 samples but the dataset holds 10"):
        ShardedLoader(dataset, 2, ShardedSampler(11, 0, 1))
    with pytest.raises(TypeError, match="dataset of tensors"):
        ShardedLoader([1, 2, 3], 2, ShardedSampler(3, 0, 1))


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_per_epoch_is_the_loaders_length(drop_last: bool) -> None:
    for num_samples in (8, 9, 37, 100):
        for world_size in (1, 2, 3, 8):
            for batch_size in (1, 4, 5, 64):
                sampler = ShardedSampler(num_samples, world_size - 1, world_size,
                                         drop_last=drop_last)
                loader = ShardedLoader(_dataset(num_samples), batch_size, sampler,
                                       drop_last=drop_last)
                assert batches_per_epoch(num_samples, world_size, batch_size, drop_last) == \
                    len(loader) == len(loader.batch_indices())
