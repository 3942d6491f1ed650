"""Data sharding: which samples each rank reads in each epoch.

:class:`ShardedSampler` gives every rank a disjoint share of one global order of the dataset:

1. Each epoch, every rank draws the same permutation of ``0..N-1`` from a ``torch.Generator``
   seeded with ``(seed, epoch)``, so no communication is needed to agree on it.
2. The permutation is brought to a multiple of the world size ``p`` (the *uneven tail* policy):

   - ``drop_last=False`` (default) pads by wrapping around to the start of the permutation, so
     every rank gets ``ceil(N / p)`` samples and the first ``total - N`` samples are seen twice;
   - ``drop_last=True`` truncates to ``floor(N / p) * p`` samples, so every rank gets
     ``floor(N / p)`` and the last ``N mod p`` samples of the permutation are skipped this epoch.

   Either way every rank takes the same number of steps, which data parallelism needs: a rank
   with one step more would wait forever in a collective the others never join.
3. Rank ``r`` takes ``indices[r::p]`` (strided), so the first ``k`` samples of every rank
   together are exactly the first ``k * p`` samples of the global order.

Which epoch a *pass* (one ``iter()``) reads follows torch's ``DataLoader`` over a
``DistributedSampler`` in a plain ``for epoch ...: for batch in loader`` loop, where every full
pass is an epoch, except that the order is reshuffled even when ``set_epoch`` is never called
(see :class:`ShardedSampler` for the exact rule).

The sampler also records how far this rank got (``position``: samples of this epoch already
consumed, advanced by the loader through :meth:`ShardedSampler.advance`), so a checkpoint taken
between batches resumes at the exact sample.  Because of step 3, ``offset + position *
world_size`` is the global point of the epoch, and a job may resume with a different world size
(an elastic job that lost a worker): the new ranks share exactly the rest of the epoch's order
from that point (their ``offset``), so no sample of the epoch is read twice or skipped; only
the rest's uneven tail is padded (or truncated) as in step 2.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["ShardedSampler", "epoch_generator"]

logger = logging.getLogger(__name__)

_STATE_KEYS = ("epoch", "position", "seed", "num_samples", "world_size")
"""Keys every saved state holds (``offset``, added later, defaults to 0)."""


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A generator seeded from ``(seed, epoch)``; distinct pairs give unrelated streams."""
    words = np.random.SeedSequence([seed % 2**64, epoch % 2**64]).generate_state(2, np.uint32)
    generator = torch.Generator()
    generator.manual_seed((int(words[0]) << 32 | int(words[1])) & (2**63 - 1))
    return generator


class ShardedSampler(Sampler[int]):
    """This rank's share of a global per-epoch permutation; resumable at the exact sample.

    Which epoch a pass reads.  A *pass* is one ``iter()`` over the sampler or over a
    :class:`~scaledl.data.loader.ShardedLoader` built on it; the loader marks samples consumed
    (:meth:`advance`) as it hands out batches.  At the start of each pass:

    1. If :meth:`set_epoch` was called since the previous pass began, the last epoch number
       given wins: the pass reads that epoch from its start, even if it is the epoch just read
       (torch's ``DistributedSampler`` re-reads it too).  The one exception is exact resume:
       ``set_epoch(e)`` right after :meth:`load_state_dict` restored epoch ``e`` keeps the
       restored position, so the pass reads only the rest of the epoch, and nothing at all if
       the checkpoint was taken after the epoch's last batch.
    2. Otherwise, if this rank has samples of the current epoch left (a fresh sampler, a pass
       stopped early by ``break``, a checkpoint restored mid-epoch), the pass reads them.
    3. Otherwise (the previous pass, or the restored checkpoint, finished the epoch) the pass
       moves on to the next epoch, ``epoch + 1``, from its start: a plain loop that never calls
       :meth:`set_epoch` reads epochs 0, 1, 2, ... with a new permutation each.

    Iterating the sampler itself does not advance the position (only :meth:`advance` does), so
    inside torch's own ``DataLoader`` it behaves as a ``DistributedSampler``: call
    :meth:`set_epoch` for a new permutation per epoch there.
    """

    def __init__(
        self,
        num_samples: int,
        rank: int,
        world_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        _validate(num_samples, rank, world_size, drop_last)
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0
        self._offset = 0
        # Why a pass should not move on by itself: set_epoch or rewind chose its epoch (rule 1).
        self._pinned = False
        # Whether the position came from load_state_dict, so set_epoch of that same epoch keeps
        # it (exact resume) instead of starting the epoch over.
        self._restored = False

    # -- geometry -------------------------------------------------------------------------------
    @property
    def samples_per_rank(self) -> int:
        """Samples this rank reads per epoch: ``ceil(N/p)``, or ``floor(N/p)`` with drop_last
        (``N`` less the :attr:`offset` when this world size took over mid-epoch)."""
        shared = self.num_samples - self._offset
        if self.drop_last:
            return shared // self.world_size
        return math.ceil(shared / self.world_size)

    @property
    def offset(self) -> int:
        """Samples of the epoch's order read before this world size took over (0 unless a job
        resumed mid-epoch with another world size)."""
        return self._offset

    @property
    def total_size(self) -> int:
        """Samples read per epoch by all ranks together after the offset (padded or
        truncated)."""
        return self.samples_per_rank * self.world_size

    def __len__(self) -> int:
        return self.samples_per_rank

    # -- epoch and position ---------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch this rank has already consumed."""
        return self._position

    @property
    def remaining(self) -> int:
        """Samples of the current epoch this rank has still to read."""
        return self.samples_per_rank - self._position

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read ``epoch`` from its start; right after :meth:`load_state_dict`
        restored ``epoch``, keep the restored position instead (exact resume)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise TypeError(f"epoch must be an int, got {epoch!r}; pass the epoch number")
        if epoch < 0:
            raise ValueError(f"epoch {epoch} must be >= 0")
        if not (self._restored and epoch == self._epoch):
            self._epoch = epoch
            self._position = 0
            self._offset = 0
            self._restored = False
        self._pinned = True

    def rewind(self) -> None:
        """Start the current epoch over (position 0), e.g. for another evaluation pass."""
        self._position = 0
        self._pinned = True

    def begin_pass(self) -> None:
        """Settle which epoch the pass now starting reads (the rule in the class docstring):
        move on to the next epoch when this one is finished and no :meth:`set_epoch` chose it.
        Iterating calls this; call it yourself only when reading :meth:`remaining_indices`
        pass by pass without iterating."""
        if not self._pinned and self._position >= self.samples_per_rank:
            self._epoch += 1
            self._position = 0
            self._offset = 0
        self._pinned = False
        self._restored = False

    def next_pass_indices(self) -> torch.Tensor:
        """The indices the next pass would read (:meth:`remaining_indices` after
        :meth:`begin_pass`), without starting it."""
        upcoming = copy.copy(self)
        upcoming.begin_pass()
        return upcoming.remaining_indices()

    def advance(self, count: int) -> None:
        """Mark ``count`` more samples of this epoch as consumed (the loader calls this)."""
        if count < 0 or self._position + count > self.samples_per_rank:
            raise ValueError(
                f"cannot advance position {self._position} by {count}: this rank has "
                f"{self.samples_per_rank} samples per epoch; advance by 0..{self.remaining}"
            )
        self._position += count

    # -- indices --------------------------------------------------------------------------------
    def global_indices(self) -> torch.Tensor:
        """The epoch's global order from the offset on, after padding (wrapping around to the
        start of the order) or truncation: ``total_size`` int64 indices."""
        if self.shuffle:
            generator = epoch_generator(self.seed, self._epoch)
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        rest = order[self._offset:]
        if self.total_size <= rest.numel():
            return rest[: self.total_size]
        repeats = math.ceil((self.total_size - rest.numel()) / self.num_samples)
        return torch.cat([rest, order.repeat(repeats)])[: self.total_size]

    def rank_indices(self) -> torch.Tensor:
        """All of this rank's indices for the current epoch, from position 0."""
        return self.global_indices()[self.rank :: self.world_size]

    def remaining_indices(self) -> torch.Tensor:
        """This rank's indices from the current position to the end of the epoch."""
        return self.rank_indices()[self._position :]

    def __iter__(self) -> Iterator[int]:
        """Begin a pass (:meth:`begin_pass`) and yield its indices: the rest of its epoch."""
        self.begin_pass()
        return iter(self.remaining_indices().tolist())

    # -- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """``epoch``, ``position``, ``offset``, ``seed``, ``num_samples``, ``world_size``:
        enough to resume."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "offset": self._offset,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`, possibly saved under another world size."""
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing}; pass a ShardedSampler.state_dict()")
        for field in ("num_samples", "seed"):
            if int(state[field]) != getattr(self, field):
                raise ValueError(
                    f"sampler state has {field}={state[field]} but this sampler has "
                    f"{field}={getattr(self, field)}; resume with the same dataset and seed"
                )
        saved_world, position = int(state["world_size"]), int(state["position"])
        offset = int(state.get("offset", 0))
        if saved_world < 1 or position < 0 or not 0 <= offset <= self.num_samples:
            raise ValueError(
                f"sampler state has world_size={saved_world}, position={position}, "
                f"offset={offset}; world_size must be >= 1, position >= 0 and offset within "
                f"0..{self.num_samples}: the checkpoint is corrupt"
            )
        self._epoch = int(state["epoch"])
        self._offset = offset
        self._pinned = False
        self._restored = True
        if saved_world == self.world_size:
            self._position = min(position, self.samples_per_rank)
            return
        self._offset = min(offset + position * saved_world, self.num_samples)
        self._position = 0
        logger.info(
            "resuming epoch %d with world size %d (saved with %d): the %d samples of the epoch "
            "not read yet are shared among the new ranks",
            self._epoch, self.world_size, saved_world, self.num_samples - self._offset,
        )


def _validate(num_samples: int, rank: int, world_size: int, drop_last: bool) -> None:
    if world_size < 1:
        raise ValueError(f"world_size {world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1} for world_size {world_size}")
    if num_samples < 1:
        raise ValueError(f"num_samples {num_samples} must be >= 1; the dataset is empty")
    if drop_last and num_samples < world_size:
        raise ValueError(
            f"drop_last with {num_samples} samples on {world_size} ranks leaves every rank "
            "empty; use drop_last=False (pads by wrap-around) or fewer ranks"
        )
