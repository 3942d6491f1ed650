"""What a shared-memory stage announces to its peers, so that different calls fail, named.

Ranks on one host meet in shared memory by counting the pieces they exchange, which says
nothing of what each piece is.  So every shared-memory stage first announces one word to its
members (:meth:`~scaledl.transport.shm.ShmGroup.announce`): the collective, its element count,
dtype, reduction and root.  A rank that waits for a peer's data compares the peer's word with
its own before reading, and a broadcast's root waits for every member's word, so an allreduce
of 8 elements against one of 6, or two ranks that each broadcast as the root, fail on every
rank with both calls named instead of reading each other's windows as if they matched.  It
costs two stores per peer and call, and a comparison per wait.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Collective, Stage
from scaledl.transport.shm import ShmGroup

__all__ = ["announce", "call_word", "describe"]

_KINDS = tuple(Collective)
_OPS = tuple(ReduceOp)
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
           torch.int64, torch.uint8, torch.int8, torch.int16, torch.bool)
_ROOTED = (Collective.BROADCAST, Collective.REDUCE)
_REDUCING = (Collective.ALLREDUCE, Collective.REDUCE_SCATTER, Collective.REDUCE)
_ELEMENT_BITS = 40


def call_word(collective: Collective, numel: int, dtype: torch.dtype, op: ReduceOp,
              root: int) -> int:
    """One int64 for a call: ``numel`` (below 2**40), then collective, op, dtype and root + 1
    (the root a local index, -1 when the collective has none)."""
    numel = min(numel, (1 << _ELEMENT_BITS) - 1)
    op_code = _OPS.index(op) if collective in _REDUCING else 0
    root_code = root + 1 if collective in _ROOTED else 0
    code = ((_KINDS.index(collective) << 4 | op_code) << 4 | _DTYPES.index(dtype)) << 10
    return numel << 22 | code | root_code


def describe(word: int, group: ShmGroup) -> str:
    """The call a word announces, in words (a root as its global rank)."""
    numel, code = word >> 22, word & ((1 << 22) - 1)
    root, code = (code & 1023) - 1, code >> 10
    dtype, code = _DTYPES[code & 15], code >> 4
    op, collective = _OPS[code & 15], _KINDS[code >> 4]
    text = f"{collective.value} of {numel} {str(dtype).removeprefix('torch.')}"
    if collective in _REDUCING:
        text += f" ({op.value})"
    if collective in _ROOTED:
        text += f" to rank {group.peers[root].global_rank}" if collective is Collective.REDUCE \
            else f" from rank {group.peers[root].global_rank}"
    return text


def announce(group: ShmGroup, members: Sequence[int], stage: Stage, dtype: torch.dtype,
             op: ReduceOp) -> None:
    """Announce ``stage`` (on ``dtype``, reducing with ``op``) to its members."""
    root = group.local_index(stage.root) if stage.collective in _ROOTED else -1
    word = call_word(stage.collective, stage.hi - stage.lo, dtype, op, root)
    group.announce(members, word, lambda other: describe(other, group))
