"""Sharded loading: batches of this rank's shard, gathered and prefetched in a background thread.

:class:`ShardedLoader` cuts the indices a :class:`~scaledl.data.sharding.ShardedSampler` gives
this rank (from its current position) into batches and gathers each with one ``index_select``
per tensor.  A producer thread keeps up to ``prefetch`` batches ready in a bounded queue while the
training step runs (``index_select`` releases the GIL).  The sampler's position advances when the
consumer *receives* a batch, never when the thread produces it, so a checkpoint taken between
batches resumes at the exact sample.

Every full pass (``for x, y in loader``) is an epoch, as with torch's ``DataLoader`` over a
``DistributedSampler``: a pass that finds the sampler's epoch finished reads the next one, with a
new permutation, whether or not ``sampler.set_epoch`` is called (the exact rule, and how
``set_epoch`` and a restored checkpoint take part in it, is in
:class:`~scaledl.data.sharding.ShardedSampler`).  Stopping early (``break``, an exception,
``close()``) stops and joins the thread; an exception raised in the thread is re-raised in the
consumer.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from scaledl.data.sharding import ShardedSampler

__all__ = ["ShardedLoader", "Batch", "batches_per_epoch"]

logger = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, ...]
"""One batch: the dataset's tensors gathered at the batch's indices (features, labels)."""

_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class _Done:
    """End of the epoch, put on the queue by the producer."""


@dataclass(frozen=True)
class _Failed:
    """The producer raised; the consumer re-raises ``error``."""

    error: BaseException


_Item = Batch | _Done | _Failed
"""What the producer thread queues: a batch, the end of the epoch, or its error."""


def _tensors_of(dataset: Any) -> tuple[torch.Tensor, ...]:
    """The tensors to gather from: ``(features, labels)`` or a ``TensorDataset``'s tensors."""
    if hasattr(dataset, "features") and hasattr(dataset, "labels"):
        return (dataset.features, dataset.labels)
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple) and tensors and all(isinstance(t, torch.Tensor) for t in tensors):
        return tensors
    raise TypeError(
        f"ShardedLoader needs a dataset of tensors (ArrayDataset or TensorDataset), got "
        f"{type(dataset).__name__}; load it with scaledl.data.load_dataset"
    )


def _gather(tensors: tuple[torch.Tensor, ...], indices: torch.Tensor) -> Batch:
    return tuple(tensor.index_select(0, indices) for tensor in tensors)


def _produce(
    tensors: tuple[torch.Tensor, ...],
    batches: list[torch.Tensor],
    ready: queue.Queue[_Item],
    stop: threading.Event,
) -> None:
    """Thread body: gather each batch and queue it; stop as soon as ``stop`` is set."""
    try:
        for indices in batches:
            if not _put(ready, _gather(tensors, indices), stop):
                return
        _put(ready, _Done(), stop)
    except BaseException as error:  # noqa: BLE001 - every failure must reach the consumer
        _put(ready, _Failed(error), stop)


def _put(ready: queue.Queue[_Item], item: _Item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            ready.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def batches_per_epoch(num_samples: int, world_size: int, batch_size: int,
                      drop_last: bool = False) -> int:
    """Batches each of ``world_size`` ranks reads in a whole epoch of ``num_samples`` (the
    ``len()`` of a :class:`ShardedLoader` whose sampler and loader share ``drop_last``), known
    before any rank starts."""
    if drop_last:
        return num_samples // world_size // batch_size
    return math.ceil(math.ceil(num_samples / world_size) / batch_size)


class ShardedLoader:
    """Batches of this rank's shard of ``dataset``, in the sampler's order, prefetched.

    Each ``iter()`` is one pass: the rest of the sampler's current epoch, or the whole next
    epoch once the current one is finished, so a plain ``for epoch in range(3): for x, y in
    loader`` trains ``len(loader)`` batches in each of the three epochs, each epoch in a new
    order.  ``sampler.set_epoch(e)`` before a pass makes it read epoch ``e`` instead (see
    :class:`~scaledl.data.sharding.ShardedSampler` for the rule, and for exact resume).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        sampler: ShardedSampler,
        prefetch: int = 2,
        *,
        drop_last: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        if prefetch < 0:
            raise ValueError(f"prefetch {prefetch} must be >= 0 (0 gathers in the calling thread)")
        tensors = _tensors_of(dataset)
        if any(len(t) != sampler.num_samples for t in tensors):
            raise ValueError(
                f"sampler covers {sampler.num_samples} samples but the dataset holds "
                f"{len(tensors[0])}; build the sampler with num_samples=len(dataset)"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.prefetch = prefetch
        self.drop_last = drop_last
        self._tensors = tensors

    def __len__(self) -> int:
        """Batches in a whole epoch of this rank (the last, partial one kept unless drop_last)."""
        per_rank = len(self.sampler)
        if self.drop_last:
            return per_rank // self.batch_size
        return math.ceil(per_rank / self.batch_size)

    def batch_indices(self) -> list[torch.Tensor]:
        """The sample indices of the batches that iterating now would give, in order."""
        return self._split(self.sampler.next_pass_indices())

    def _split(self, indices: torch.Tensor) -> list[torch.Tensor]:
        if indices.numel() == 0:  # torch.split would give one empty batch
            return []
        batches = list(torch.split(indices, self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def __iter__(self) -> _LoaderIterator:
        """Begin a pass: the rest of the sampler's epoch, or the next epoch if it is finished."""
        self.sampler.begin_pass()
        batches = self._split(self.sampler.remaining_indices())
        # The samples drop_last leaves out count as read with the last batch, so a pass that
        # hands out its last batch finishes the epoch (and a checkpoint taken then says so).
        dropped = self.sampler.remaining - sum(len(indices) for indices in batches)
        if not batches:
            self.sampler.advance(dropped)
        return _LoaderIterator(self._tensors, batches, self.sampler, self.prefetch, dropped)


class _LoaderIterator(Iterator[Batch]):
    """One pass over the rest of the epoch; owns the producer thread, if any."""

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        batches: list[torch.Tensor],
        sampler: ShardedSampler,
        prefetch: int,
        dropped: int = 0,
    ) -> None:
        self._thread: threading.Thread | None = None  # first: __del__ reads it
        self._tensors = tensors
        self._batches = batches
        # Samples each batch marks consumed: its own, and the dropped tail with the last one.
        self._sizes = [len(indices) for indices in batches]
        if self._sizes:
            self._sizes[-1] += dropped
        self._sampler = sampler
        self._next = 0
        if prefetch > 0 and batches:
            self._ready: queue.Queue[_Item] = queue.Queue(maxsize=prefetch)
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=_produce,
                args=(tensors, batches, self._ready, self._stop),
                name="scaledl-prefetch",
                daemon=True,
            )
            self._thread.start()

    def __next__(self) -> Batch:
        if self._next >= len(self._sizes):
            self.close()
            raise StopIteration
        batch = self._take()
        self._sampler.advance(self._sizes[self._next])
        self._next += 1
        return batch

    def _take(self) -> Batch:
        if self._thread is None:
            return _gather(self._tensors, self._batches[self._next])
        item = self._ready.get()
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        assert not isinstance(item, _Done), "producer finished before the last batch"
        return item

    def close(self) -> None:
        """Stop and join the producer thread; safe to call more than once."""
        thread, self._thread = self._thread, None
        self._next = len(self._sizes)
        if thread is None:
            return
        self._stop.set()
        if thread.is_alive():
            logger.debug("stopping the prefetch thread before the end of the epoch")
        while thread.is_alive():
            try:
                self._ready.get_nowait()
            except queue.Empty:
                thread.join(_POLL_SECONDS)

    def __enter__(self) -> _LoaderIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
