"""What a shared-memory stage announces to its peers, so that different calls fail, named.

Ranks on one host meet in shared memory by counting the pieces they exchange, which says
nothing of what each piece is.  So every shared-memory stage first announces one word to its
members (:meth:`~scaledl.transport.shm.ShmGroup.announce`): the packed word of the call's
:class:`~scaledl.signature.Signature` (the collective, its element count, dtype, reduction and
root), the same encoding every other agreement check of scaledl uses.  A rank that waits for
a peer's data compares the peer's word with its own before reading, and a broadcast's root
waits for every member's word, so an allreduce of 8 elements against one of 6, or two ranks
that each broadcast as the root, fail on every rank with both calls named instead of reading
each other's windows as if they matched.  Data may already have moved when a word differs, so
this check, unlike the exchanged ones, fails the shared-memory group for later calls too.  It
costs two stores per peer and call, and a comparison per wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective, Stage
from scaledl.signature import Kind, Signature
from scaledl.transport.shm import ShmGroup

__all__ = ["announce", "call_word", "describe"]

_ROOTED = (Collective.BROADCAST, Collective.REDUCE)
_REDUCING = (Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE)


@lru_cache(maxsize=1024)  # on every stage's path: the same few calls repeat
def call_word(collective: Collective, numel: int, dtype: torch.dtype, op: ReduceOp,
              root: int) -> int:
    """The call's packed :meth:`~scaledl.signature.Signature.word` (``root`` a local index,
    -1 when the collective has none)."""
    return Signature(Kind(collective.value), numel, dtype,
                     op.value if collective in _REDUCING else None,
                     root if collective in _ROOTED else -1).word()


def describe(word: int, group: ShmGroup) -> str:
    """The call a word announces, in words (a root as its global rank)."""
    call = Signature.from_word(word)
    if call.root >= 0:
        call = Signature(call.kind, call.numel, call.dtype, call.op,
                         group.peers[call.root].global_rank, dtype_code=call.dtype_code)
    return call.describe()


def announce(group: ShmGroup, members: Sequence[int], stage: Stage, dtype: torch.dtype,
             op: ReduceOp) -> None:
    """Announce ``stage`` (on ``dtype``, reducing with ``op``) to its members."""
    root = group.local_index(stage.root) if stage.collective in _ROOTED else -1
    word = call_word(stage.collective, stage.hi - stage.lo, dtype, op, root)
    group.announce(members, word, lambda other: describe(other, group))
    if stage.hi <= stage.lo:
        # No data moves, so nothing in the stage waits for the peers: wait for their
        # announcements instead.  Every call must wait for something each peer writes in it,
        # or this rank could announce its next-but-one call over the slot a late peer has yet
        # to check (docs/algorithms.md, the invariants table).
        for peer in members:
            if peer != group.index:
                group.agreed(peer)
