"""Shared memory among the ranks of one host: windows, sequence counters and waits.

A :class:`ShmGroup` joins the ranks of one host that belong to one communicator.  Each rank owns
a segment (:mod:`scaledl.transport.shm_segment`) with two data *windows* (double buffering) and
maps every peer's.  A collective moves through the windows piece by piece; ranks tell each other
how far they are through *pair counters*: for every pair of ranks ``(i, j)``, both count the
pieces they have exchanged, and since two ranks take part in their joint collectives in the same
order (a communicator runs its jobs in one order on every rank), both counts agree without
talking.  That makes any subset of the host's ranks a valid set of members for a collective
(e.g. one axis of a 2x2 layout), with no global barrier.

The owner ``i`` writes, in its own segment, for each peer ``j``:

- ``arrived[j][w]``: the pair count of the piece now in window ``w`` (its data is complete);
- ``shared[j]`` and ``where[j]``: minus the pair count of the operation whose data lies in one
  of ``i``'s arenas, and where (arena and offset); a line of its own, so an arena operation never
  overwrites the arrival of a window piece that a peer has not read yet;
- ``reduced[j]``: the pair count up to which ``i``'s shard of the piece is reduced;
- ``released[j]``: the pair count up to which ``i`` has finished reading ``j``'s window;
- ``call[j][n % 2]`` and ``described[j][n % 2]``: the number ``n`` of ``i``'s current collective
  with ``j`` and a word describing it (:meth:`ShmGroup.announce`).  Whoever waits for a peer's
  data checks the peer's word against its own first, so ranks that make different calls (other
  sizes, dtypes, ops or roots) fail with both calls named instead of reading each other's
  windows as if they matched.

The rule that keeps every word readable: a word that a peer waits to see *equal* to a value
(``arrived``, ``shared``, ``where``, ``call``, ``described``) is rewritten only after every peer
that waits for its previous value has published ``released`` (or announced a later call) past
it; words that peers wait to see *reach* a value (``reduced``, ``released``) only grow.  So
before overwriting a window, the owner waits until every peer that read its previous contents
has released it, and an arena operation returns only once every peer released it.
docs/algorithms.md ("The shared-memory protocol") has the table of every word.

Counters are written after the data they announce; on x86 (total store order) that order is what
the other cores see, so no fence is needed.  Python has no memory barrier to order them on weaker
CPUs, so the shared-memory path is offered on x86 only.

Every wait spins briefly (not at all when the host's ranks outnumber their cores: the
spinning rank would hold the core its peer needs; :attr:`ShmGroup.spins`), then yields the CPU
(and the GIL), then naps, checks every
``CHECK_S`` seconds that the awaited peer still runs (its pid and start time), and gives up
after the group's timeout; both end in a :class:`~scaledl.transport.base.TransportError` naming
the peer.  Naps grow with the wait (:func:`nap_seconds`): every wake-up of a napping rank
preempts whatever runs on its core, and with more ranks than cores that is often the very peer
it waits for.  Yielding for longer is no cure: a rank that keeps yielding counts as load, so
the scheduler leaves two computing ranks on one core beside it (``benchmarks/paths/wait_theft.py``;
docs/benchmarks.md, "What a waiting rank costs").

A rank that fails inside a shared-memory collective raises its *aborted* flag so that
its peers stop waiting at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scaledl.topology import host_cores
from scaledl.transport.base import TransportError
from scaledl.transport.shm_jitter import Jitter
from scaledl.transport.shm_segment import Segment, process_alive

__all__ = [
    "ShmGroup", "Peer", "CHECK_S", "control_lines", "nap_seconds", "spins_for", "WaitCounts",
    "SmallPiece",
]

CHECK_S = 0.05
"""Seconds between liveness checks of an awaited peer (a death is noticed within this)."""
SPINS = 200
"""Checks before the first yield (a few microseconds), when every rank of the host has a core
of its own (:attr:`ShmGroup.spins`)."""
YIELD_S = 0.002
"""Seconds of yielding the CPU (``sched_yield``) before waiting turns into naps."""
NAP_S = 50e-6
"""The shortest nap (the first after the yielding)."""
NAP_FRACTION = 1 / 16
"""A nap lasts at most this fraction of the time waited so far, so noticing an arrival late
adds at most about 6% to a wait."""
NAP_MAX_S = 1e-3
"""The longest nap: a waiter wakes at most a thousand times a second."""
ABORTED = 0
"""Line of the segment's own word: 0 while the rank takes part, :data:`FAILED` once it failed
inside a collective, :data:`LEFT` once it closed the group (finished, or shut down), and
:data:`ERRORED` once it closed it on its way out after an uncaught error of its own."""
FAILED, LEFT, ERRORED = 1, 2, 3
ARRIVED, REDUCED, RELEASED, WHERE, CALL, DESCRIBED, SHARED = 0, 2, 3, 4, 5, 7, 9
PAIR_LINES = 10
"""Control lines per peer: arrived (two windows), reduced, released, where a piece that lives
in a shared arena is (arena and offset), the current call's number and description (two of
each: a peer may be one call ahead), and the arrival of arena data (shared)."""
_TWO_LINES = (ARRIVED, CALL, DESCRIBED)


_ITEMSIZE = {
    dtype: torch.empty(0, dtype=dtype).element_size()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                  torch.int64, torch.uint8, torch.int8, torch.int16)
}


@dataclass
class WaitCounts:
    """How this rank's waits for peers ended, counted since the group opened: the evidence
    behind the spin/yield/nap schedule (``benchmarks/peers/small_message.py`` prints it)."""

    ready: int = 0
    """Waits whose word was already there at the first look."""
    spun: int = 0
    """Waits that ended while spinning (within :data:`SPINS` checks)."""
    yielded: int = 0
    """Waits that ended while yielding the CPU (the first :data:`YIELD_S`)."""
    napped: int = 0
    """Waits that ended after naps."""
    yield_seconds: float = 0.0
    """Seconds spent in waits that ended while yielding."""
    nap_seconds: float = 0.0
    """Seconds spent in waits that ended after naps."""


def _exiting_on_error() -> bool:
    """True while the interpreter exits because of an uncaught exception: Python keeps it in
    ``sys.last_value`` before the exit handlers (which close the groups) run.  In an interactive
    session an earlier error that the prompt reported counts too: the peers then hear of an
    error where the rank may have finished cleanly, which only changes their message."""
    return getattr(sys, "last_value", None) is not None


def spins_for(ranks: int, cores: int) -> int:
    """Checks a wait spins before it yields, for ``ranks`` ranks of a host on ``cores`` cores:
    :data:`SPINS`, or none when the ranks outnumber the cores (:attr:`ShmGroup.spins`)."""
    return SPINS if ranks <= cores else 0


def nap_seconds(waited: float) -> float:
    """How long a wait that has lasted ``waited`` seconds naps next: ``waited * NAP_FRACTION``
    clamped to ``[NAP_S, NAP_MAX_S]``, so a peer that arrives during a nap is noticed late by
    little relative to the wait, and a long wait wakes up rarely."""
    return min(NAP_MAX_S, max(NAP_S, waited * NAP_FRACTION))


def control_lines(local_size: int) -> int:
    """Control lines a segment needs for a host of ``local_size`` ranks."""
    return 1 + PAIR_LINES * local_size


@dataclass
class Peer:
    """A rank of this host as the group knows it."""

    rank: int
    """Rank in the communicator's group."""
    global_rank: int
    pid: int
    start_time: int
    segment: Segment


@dataclass(frozen=True)
class SmallPiece:
    """Everything a one-piece exchange of ``numel`` elements of ``dtype`` among fixed members
    reads and writes, found once (:meth:`ShmGroup.small_piece`): the per-call work of the small
    messages' path is then stores, loads and copies, no lookups (a 4 KiB allreduce moves its
    data in about a microsecond; docs/benchmarks.md)."""

    members: tuple[int, ...]
    """Local indices, in the order the windows are read."""
    peers: tuple[int, ...]
    """The members other than this rank."""
    mine: tuple[np.ndarray, ...]
    """This rank's window of each slot, as the piece's elements."""
    windows: tuple[tuple[np.ndarray, ...], ...]
    """Per member (in member order), its window of each slot as the piece's elements."""
    out_lines: tuple[tuple[int, ...], ...]
    """Per peer: this rank's word indices towards it (:data:`PAIR_LINES` of them)."""
    in_lines: tuple[tuple[int, ...], ...]
    """Per peer: its word indices towards this rank."""


@dataclass
class ShmGroup:
    """The ranks of one host joined by shared memory; this rank is ``local[index]``."""

    peers: list[Peer]
    """Every rank of the host, this one included, in local order."""
    index: int
    """This rank's local index."""
    timeout: float
    """Seconds a wait may last before the peer is reported."""
    _pair: list[int] = field(init=False)
    _next_window: int = field(init=False, default=0)
    _readers: list[list[tuple[int, int]]] = field(init=False)
    _words: list[np.ndarray] = field(init=False)
    _cells: list[memoryview] = field(init=False)
    """The same words as memoryviews: a Python int in and out, about 40% faster a read or a
    store than NumPy's scalars (the small messages' path does a dozen per call)."""
    _windows: list[list[torch.Tensor]] = field(init=False)
    _arrays: list[list[np.ndarray]] = field(init=False)
    _out_lines: list[list[int]] = field(init=False)
    _in_lines: list[list[int]] = field(init=False)
    _broken: str | None = field(init=False, default=None)
    _arenas: dict[int, list[torch.Tensor]] = field(init=False, default_factory=dict)
    _arena_bases: dict[int, int] = field(init=False, default_factory=dict)
    _arenas_made: int = field(init=False, default=0)
    jitter: Jitter | None = field(init=False, default=None)
    """Random delays at every control-word read, write and wait (tests only; see
    :mod:`scaledl.transport.shm_jitter`)."""
    _calls: list[int] = field(init=False)
    _current: tuple[int, Callable[[int], str]] | None = field(init=False, default=None)
    _small: dict[tuple[object, ...], SmallPiece] = field(init=False, default_factory=dict)
    waits: WaitCounts = field(init=False, default_factory=WaitCounts)
    """How the waits for peers ended (spinning, yielding, napping)."""
    spins: int = field(init=False, default=SPINS)
    """Checks of an awaited word before the wait yields the CPU: :data:`SPINS` while the
    host's ranks have a core each, none when they outnumber the cores they may run on
    together (:func:`~scaledl.topology.host_cores` of their pids).  A rank that spins holds
    the core the awaited peer needs: with 4 ranks on 2 cores, 200 spins took 1.1-1.8x the
    time of yielding at once from 4 KiB to 1 MiB (docs/benchmarks.md, "What changed in the
    shared-memory path");
    ``sched_yield`` returns at once when nothing else wants the core."""

    def __post_init__(self) -> None:
        self._pair = [0] * len(self.peers)
        self._calls = [0] * len(self.peers)
        self._readers = [[] for _ in range(self.own.slots)]
        self._words = [peer.segment.words for peer in self.peers]
        self._cells = [words.data for words in self._words]
        # Word indices of every pair line, both ways, computed once: the small messages'
        # path reads a few of them per call.
        own = self.peers[self.index].segment
        self._out_lines = [[own.control(1 + PAIR_LINES * peer + line) for line in range(PAIR_LINES)]
                           for peer in range(len(self.peers))]
        self._in_lines = [[peer.segment.control(1 + PAIR_LINES * self.index + line)
                           for line in range(PAIR_LINES)] for peer in self.peers]
        self._arrays = [[peer.segment.data(slot) for slot in range(peer.segment.slots)]
                        for peer in self.peers]
        self._windows = [[torch.from_numpy(array) for array in arrays] for arrays in self._arrays]
        self.jitter = Jitter.from_environment(self.peers[self.index].global_rank)
        self.spins = spins_for(len(self.peers), host_cores(peer.pid for peer in self.peers))

    # -- layout -----------------------------------------------------------------------------
    def local_index(self, rank: int) -> int:
        """Local index of group rank ``rank`` (a ``ValueError`` if it is not on this host)."""
        for index, peer in enumerate(self.peers):
            if peer.rank == rank:
                return index
        raise ValueError(f"rank {rank} is not on this host")

    @property
    def own(self) -> Segment:
        """This rank's segment."""
        return self.peers[self.index].segment

    @property
    def window(self) -> int:
        """Bytes of one data window."""
        return self.own.window

    def window_of(self, local: int, slot: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """The first ``numel`` elements of window ``slot`` of rank ``local`` as ``dtype``."""
        return self._windows[local][slot][:numel * _ITEMSIZE[dtype]].view(dtype)

    def array_of(self, local: int, slot: int, dtype: np.dtype[Any], numel: int) -> np.ndarray:
        """The first ``numel`` elements of window ``slot`` of rank ``local`` as a NumPy array
        of ``dtype`` (a view, made in a fraction of :meth:`window_of`'s time: small messages
        are where that shows)."""
        return self._arrays[local][slot][:numel * dtype.itemsize].view(dtype)

    # -- arenas: tensors that live in shared memory ---------------------------------------------
    def add_arena(self, segments: Sequence[Segment]) -> tuple[int, torch.Tensor]:
        """Register an arena (one segment per rank of the host, in local order); return its id
        and this rank's memory as bytes.  Tensors carved from it are reduced in place, with no
        copy in.  Ids count the arenas made, never reused, so they agree on every rank as long
        as all make them in one order (a collective does)."""
        views = [torch.from_numpy(segment.data(0)) for segment in segments]
        arena = self._arenas_made
        self._arenas_made += 1
        # Replaced, not mutated: release_arena may run on another thread (a finalizer).
        self._arenas = {**self._arenas, arena: views}
        self._arena_bases = {**self._arena_bases, arena: views[self.index].data_ptr()}
        return arena, views[self.index]

    def release_arena(self, arena: int) -> None:
        """Forget arena ``arena``: the group holds no view of it any more, so each segment is
        unmapped as soon as the last tensor carved from it is gone."""
        self._arenas = {key: views for key, views in self._arenas.items() if key != arena}
        self._arena_bases = {key: base for key, base in self._arena_bases.items() if key != arena}

    @property
    def arenas(self) -> int:
        """Arenas registered and not released."""
        return len(self._arenas)

    def locate(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        """``(arena, byte offset)`` of ``tensor`` when it lies in one of this rank's arenas."""
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        arenas = self._arenas
        for arena, base in self._arena_bases.items():
            views = arenas.get(arena)
            if views is not None and base <= start and end <= base + views[self.index].numel():
                return arena, start - base
        return None

    def arena_of(
        self, local: int, where: tuple[int, int], dtype: torch.dtype, numel: int
    ) -> torch.Tensor:
        """``numel`` elements of ``dtype`` at ``where`` in rank ``local``'s arena."""
        arena, offset = where
        return self._arenas[arena][local][offset:offset + numel * _ITEMSIZE[dtype]].view(dtype)

    def begin_shared(self, members: Sequence[int]) -> dict[int, int]:
        """Start an operation on arena data among ``members``: pair counts, no window."""
        return self._count(members)

    def _count(self, members: Sequence[int]) -> dict[int, int]:
        """One more joint piece with every other member: the pair counts of this piece."""
        self._check_usable()
        counts = {}
        for peer in members:
            if peer != self.index:
                self._pair[peer] += 1
                counts[peer] = self._pair[peer]
        return counts

    def publish_shared(self, counts: dict[int, int], where: tuple[int, int]) -> None:
        """Announce that this rank's data (in its arena at ``where``) is ready.  The previous
        arena operation returned only after every peer released it, so no peer still waits
        for the values overwritten here."""
        words = self._words[self.index]
        code = (where[0] << 40) + where[1] + 1
        for peer, count in counts.items():
            self._pause("write where")
            words[self._own_line(WHERE, peer)] = code
            self._pause("write shared")
            words[self._own_line(SHARED, peer)] = -count
        self._pause("published shared")

    def arrived_shared(self, peer: int, count: int, where: tuple[int, int]) -> None:
        """Wait for ``peer``'s arena data of operation ``count``; it must sit where ours does."""
        words = self._words[peer]
        line = self._peer_line(peer, SHARED)
        self._pause("read shared")
        if words[line] != -count:
            self._wait(peer, -1, -count, "bring its data", (line, line))
        self._verify(peer)
        code = (where[0] << 40) + where[1] + 1
        self._pause("read where")
        if words[self._peer_line(peer, WHERE)] != code:
            self._fail(f"rank {self.peers[peer].global_rank} reduces a tensor at another place "
                       "of shared memory than this rank; every rank must allocate its shared "
                       "buffers alike (same model, same order)")

    def _own_line(self, kind: int, peer: int, slot: int = 0) -> int:
        """Word index, in this rank's segment, of its counter ``kind`` towards ``peer``."""
        extra = slot if kind in _TWO_LINES else 0
        assert 0 <= extra < 2 and kind + extra < PAIR_LINES
        return self._out_lines[peer][kind + extra]

    def _peer_line(self, peer: int, kind: int, slot: int = 0) -> int:
        """Word index, in ``peer``'s segment, of its counter ``kind`` towards this rank."""
        return self._in_lines[peer][kind + (slot if kind in _TWO_LINES else 0)]

    # -- one call: what every member is about to do ---------------------------------------------
    def announce(self, members: Sequence[int], word: int, describe: Callable[[int], str]) -> None:
        """Start a collective among ``members`` that ``word`` describes (``describe`` names a
        word in an error); every wait for a peer's data in it checks the peer's word first."""
        self._check_usable()
        words = self._words[self.index]
        for peer in members:
            if peer != self.index:
                self._calls[peer] += 1
                number = self._calls[peer]
                self._pause("write described")
                words[self._own_line(DESCRIBED, peer, number % 2)] = word
                self._pause("write call")
                words[self._own_line(CALL, peer, number % 2)] = number
        self._pause("announced")
        self._current = (word, describe)

    def agreed(self, peer: int) -> None:
        """Wait until ``peer`` has announced this call, and check that it is the same one."""
        if self._current is not None:
            line = self._peer_line(peer, CALL, self._calls[peer] % 2)
            self._pause("read call")
            if self._words[peer][line] < self._calls[peer]:
                self._wait(peer, line, self._calls[peer], "start the same collective")
            self._verify(peer)

    def _verify(self, peer: int) -> None:
        """Fail unless ``peer``'s current call (it has announced it) is this rank's."""
        if self._current is None:
            return
        mine, describe = self._current
        self._pause("read described")
        number, slot, words = self._calls[peer], self._calls[peer] % 2, self._words[peer]
        if words[self._peer_line(peer, CALL, slot)] != number:
            theirs = "another collective"
        else:
            word = int(words[self._peer_line(peer, DESCRIBED, slot)])
            if word == mine:
                return
            theirs = describe(word)
        self._fail(f"rank {self.peers[peer].global_rank} called {theirs} but rank "
                   f"{self.peers[self.index].global_rank} called {describe(mine)} through shared "
                   "memory; every rank of the group must make the same collective calls (sizes, "
                   "dtypes, ops and roots) in the same order")

    # -- one piece ------------------------------------------------------------------------------
    def begin(self, members: Sequence[int]) -> tuple[int, dict[int, int]]:
        """Start a piece among ``members`` (local indices, this rank included): claim a window,
        wait until its previous readers released it, and return (window, pair count per peer)."""
        counts = self._count(members)
        slot = self._next_window
        self._next_window = (slot + 1) % self.own.slots
        for peer, count in self._readers[slot]:
            self.reached(peer, RELEASED, count, "finish reading this rank's window")
        self._readers[slot] = list(counts.items())
        return slot, counts

    def publish(self, kind: int, counts: dict[int, int], slot: int = 0) -> None:
        """Announce to every peer of the piece that this rank reached ``kind``."""
        words = self._words[self.index]
        line = kind + (slot if kind in _TWO_LINES else 0)
        lines = self._out_lines
        for peer, count in counts.items():
            self._pause("write")
            words[lines[peer][line]] = count
        self._pause("published")

    def arrived(self, peer: int, count: int) -> int:
        """Wait until ``peer``'s data of piece ``count`` is in one of its windows; return it."""
        words = self._words[peer]
        first = self._peer_line(peer, ARRIVED, 0)
        second = self._peer_line(peer, ARRIVED, 1)
        self._pause("read arrived")
        if words[first] != count and words[second] != count:
            self._wait(peer, -1, count, "bring its data", (first, second))
        else:
            self.waits.ready += 1
        self._verify(peer)
        return 0 if words[first] == count else 1

    def reached(self, peer: int, kind: int, count: int, what: str) -> None:
        """Wait until ``peer`` published ``kind`` for piece ``count``."""
        line = self._peer_line(peer, kind)
        self._pause("read")
        if self._words[peer][line] < count:
            self._wait(peer, line, count, what)
        else:
            self.waits.ready += 1

    # -- one small piece, prepared ------------------------------------------------------------
    def small_piece(self, members: Sequence[int], dtype: np.dtype[Any], numel: int) -> SmallPiece:
        """The prepared exchange of one piece of ``numel`` elements (at most a window) among
        ``members`` (cached: the same few calls repeat)."""
        key = (tuple(members), dtype, numel)
        piece = self._small.get(key)
        if piece is None:
            nbytes = numel * dtype.itemsize
            assert nbytes <= self.window, (nbytes, self.window)
            peers = tuple(peer for peer in members if peer != self.index)
            piece = SmallPiece(
                tuple(members), peers,
                tuple(array[:nbytes].view(dtype) for array in self._arrays[self.index]),
                tuple(tuple(array[:nbytes].view(dtype) for array in self._arrays[member])
                      for member in members),
                tuple(tuple(self._out_lines[peer]) for peer in peers),
                tuple(tuple(self._in_lines[peer]) for peer in peers))
            if len(self._small) >= 256:  # sizes that never repeat must not pile up
                self._small.clear()
            self._small[key] = piece
        return piece

    def small_arrive(
        self, piece: SmallPiece, data: np.ndarray, word: int | None = None,
        describe: Callable[[int], str] | None = None, skip: tuple[int, int] = (0, 0),
    ) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
        """One piece of ``piece``'s shape: with ``word``, first announce the call it belongs to
        (:meth:`announce`); claim a window, copy ``data`` in (but for the stretch ``skip``,
        which no peer reads), announce it, wait for every peer's (checking its call); return
        every member's window holding the piece, in member order, and the pair counts for
        :meth:`small_publish`.

        The same protocol, word for word, as :meth:`announce`, :meth:`begin`,
        :meth:`publish` and :meth:`arrived` one after the other (so a peer may take either
        way), without their generality: no dictionaries, no line arithmetic, words read and
        written as Python ints."""
        if self._broken is not None:
            self._check_usable()
        jitter = self.jitter
        cells = self._cells
        own = cells[self.index]
        calls, pair = self._calls, self._pair
        ready = 0  # waits found done at the first look (added to self.waits once, at the end;
        # a wait that fails loses this call's count, which is only diagnostics)
        if word is not None:
            assert describe is not None
            for peer, lines in zip(piece.peers, piece.out_lines):
                number = calls[peer] + 1
                calls[peer] = number
                if jitter is not None:
                    jitter.pause("write described")
                own[lines[DESCRIBED + (number & 1)]] = word
                if jitter is not None:
                    jitter.pause("write call")
                own[lines[CALL + (number & 1)]] = number
            if jitter is not None:
                jitter.pause("announced")
            self._current = (word, describe)
        counts = []
        for peer in piece.peers:
            count = pair[peer] + 1
            pair[peer] = count
            counts.append((peer, count))
        slot = self._next_window
        self._next_window = slot ^ 1 if len(piece.mine) == 2 else (slot + 1) % len(piece.mine)
        readers = self._readers
        for peer, count in readers[slot]:  # :meth:`reached`, its first look inline
            if jitter is None and cells[peer][self._in_lines[peer][RELEASED]] >= count:
                ready += 1
            else:
                self.reached(peer, RELEASED, count, "finish reading this rank's window")
        readers[slot] = counts
        mine = piece.mine[slot]
        skip_lo, skip_hi = skip
        # Slice assignment, not np.copyto: the same copy at 0.4 of the call overhead (4 KiB);
        # ``data`` has the piece's dtype (pieces are made per dtype), so nothing is cast.
        if skip_hi > skip_lo:
            mine[:skip_lo] = data[:skip_lo]
            mine[skip_hi:] = data[skip_hi:]
        else:
            mine[...] = data
        self.small_publish(ARRIVED + slot, counts, piece)
        slot_of = [slot] * len(self.peers)  # the window each member's piece is in
        current = self._current
        for (peer, count), lines in zip(counts, piece.in_lines):
            words = cells[peer]
            first, second = lines[ARRIVED], lines[ARRIVED + 1]
            if jitter is not None:
                jitter.pause("read arrived")
            if words[first] == count:
                ready += 1
                slot_of[peer] = 0
            elif words[second] == count:
                ready += 1
                slot_of[peer] = 1
            else:
                self._wait(peer, -1, count, "bring its data", (first, second))
                slot_of[peer] = 0 if words[first] == count else 1
            if current is not None:  # :meth:`_verify`, inline while the words match
                number = calls[peer]
                if jitter is not None:
                    jitter.pause("read described")
                if (words[lines[CALL + (number & 1)]] != number
                        or words[lines[DESCRIBED + (number & 1)]] != current[0]):
                    self._verify(peer)
        if ready:
            self.waits.ready += ready
        windows = [window[slot_of[member]]
                   for member, window in zip(piece.members, piece.windows)]
        return windows, counts

    def small_publish(self, kind: int, counts: list[tuple[int, int]], piece: SmallPiece) -> None:
        """Tell the peers of a :meth:`small_arrive` piece that this rank reached ``kind``
        (``ARRIVED`` plus the window slot, ``REDUCED`` or ``RELEASED``; :meth:`publish` without
        its dictionary)."""
        own = self._cells[self.index]
        jitter = self.jitter
        for (_, count), lines in zip(counts, piece.out_lines):
            if jitter is not None:
                jitter.pause("write")
            own[lines[kind]] = count
        if jitter is not None:
            jitter.pause("published")

    # -- waiting --------------------------------------------------------------------------------
    def _wait(
        self, peer: int, line: int, count: int, what: str, either: tuple[int, int] | None = None,
    ) -> None:
        """Spin, then yield, then nap: a peer a few microseconds behind costs a few
        microseconds; one that computes for seconds costs next to no CPU (naps that grow
        to ``NAP_MAX_S``, :func:`nap_seconds`).  The spin reads the word inline (a function
        call per check would triple its period)."""
        words = self._words[peer]
        done = self._done
        waits = self.waits
        self._pause("wait")
        if either is None:
            for _ in range(self.spins):
                if words[line] >= count:
                    waits.spun += 1
                    self._pause("waited")
                    return
        else:
            first, second = either
            for _ in range(self.spins):
                if words[first] == count or words[second] == count:
                    waits.spun += 1
                    self._pause("waited")
                    return
        start = time.monotonic()
        check = start + CHECK_S
        napped = False
        while not done(words, line, count, either):
            now = time.monotonic()
            if now - start < YIELD_S:
                os.sched_yield()
            else:
                napped = True
                time.sleep(nap_seconds(now - start))
            if now >= check:
                self._check_peer(peer, what, now - start)
                check = now + CHECK_S
        waited = time.monotonic() - start
        if napped:
            waits.napped += 1
            waits.nap_seconds += waited
        else:
            waits.yielded += 1
            waits.yield_seconds += waited
        self._pause("waited")

    def _pause(self, point: str) -> None:
        """A random delay at ``point`` when the test hook is on; nothing otherwise."""
        if self.jitter is not None:
            self.jitter.pause(point)

    @staticmethod
    def _done(words: np.ndarray, line: int, count: int, either: tuple[int, int] | None) -> bool:
        if either is not None:
            return bool(words[either[0]] == count or words[either[1]] == count)
        return bool(words[line] >= count)

    def _check_peer(self, peer: int, what: str, waited: float) -> None:
        target = self.peers[peer]
        rank = target.global_rank
        state = self._words[peer][self._abort_line(peer)]
        if state == FAILED:
            self._fail(f"rank {rank} aborted the shared-memory collective after an error")
        if state == ERRORED:
            self._fail(f"rank {rank} exited after an error of its own (its output names it) "
                       f"while rank {self.peers[self.index].global_rank} waits for it in a "
                       "shared-memory collective")
        if state == LEFT:
            self._fail(f"rank {rank} left the group (it finished or shut down) while rank "
                       f"{self.peers[self.index].global_rank} waits for it in a shared-memory "
                       "collective: the ranks made different numbers of collective calls; "
                       "give every rank the same number of steps (batches per epoch, epochs)")
        if not process_alive(target.pid, target.start_time):
            self._fail(f"rank {rank} (pid {target.pid}) died during a shared-memory collective")
        if waited > self.timeout:
            self._fail(f"rank {rank} did not {what} within {self.timeout:g} s in a shared-memory "
                       "collective; it may be stuck or running different collectives")

    def _abort_line(self, peer: int) -> int:
        return self.peers[peer].segment.control(ABORTED)

    def _fail(self, reason: str) -> None:
        self.abort(reason)
        raise TransportError(reason)

    # -- failure --------------------------------------------------------------------------------
    def abort(self, reason: str) -> None:
        """Tell every peer to stop waiting for this rank; the group is unusable afterwards."""
        self._broken = self._broken or reason
        self._words[self.index][self.own.control(ABORTED)] = FAILED

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise TransportError(f"the shared-memory group is unusable after an earlier failure "
                                 f"({self._broken}); restart the job")

    def close(self) -> None:
        """Tell the peers this rank has left, and whether after an uncaught error (a peer still
        waiting for it then says which), drop the views and unmap every segment."""
        if self._words and self._broken is None:
            self._words[self.index][self.own.control(ABORTED)] = (
                ERRORED if _exiting_on_error() else LEFT)
        self._windows = []
        self._words = []
        self._cells = []
        self._arrays = []
        self._small = {}
        self._arenas = {}
        self._arena_bases = {}
        for peer in self.peers:
            peer.segment.close()


