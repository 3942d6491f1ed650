"""Joining the ranks of each host by shared memory, when a communicator opens.

:func:`open_shm` is a collective of the whole group (over scaledl's channel), so that every rank
learns the same answer: either every host's ranks are joined, or none are and the job uses the
network path, with a warning that says why and what to change.  Steps:

1. each rank says whether it can take part (x86 CPU, ``SCALEDL_SHM`` not 0) and a random nonce;
   rank 0's nonce names this group's segments;
2. each rank on a host with other ranks of the group removes segments left by killed jobs, then
   creates and allocates its segment (owner-only); everyone reports success;
3. each maps its host peers' segments and checks their headers; everyone reports success;
4. each unlinks its own file: from now on the memory is held only by the mappings.

A failure at any step on any rank (``/dev/shm`` too small: Docker's default is 64 MiB) closes and
removes everything and returns ``None``.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Sequence

import torch

from scaledl.transport.channel import Channel
from scaledl.transport.shm import Peer, ShmGroup, control_lines
from scaledl.transport.shm_segment import (
    Segment, SegmentError, needs_fence, process_start_time, remove_leftovers, segment_dir,
)

__all__ = [
    "open_shm", "open_arena", "join_segments", "shm_supported", "SHM_ENV", "WINDOW_ENV",
    "DEFAULT_WINDOW_MB", "window_bytes",
]

log = logging.getLogger(__name__)

SHM_ENV = "SCALEDL_SHM"
"""Set to 0 to keep every byte on the network path."""
WINDOW_ENV = "SCALEDL_SHM_WINDOW_MB"
"""Size of one shared-memory window in MiB (each rank holds two)."""
DEFAULT_WINDOW_MB = 4.0
SLOTS = 2


def window_bytes() -> int:
    """Bytes of one window: ``SCALEDL_SHM_WINDOW_MB`` MiB (default 4), a multiple of 4 KiB."""
    text = os.environ.get(WINDOW_ENV, "").strip()
    try:
        mib = float(text) if text else DEFAULT_WINDOW_MB
    except ValueError:
        raise ValueError(f"{WINDOW_ENV}={text!r} is not a number; set it to a size in MiB, "
                         "e.g. 4") from None
    if not 0.0625 <= mib <= 1024:
        raise ValueError(f"{WINDOW_ENV}={text!r} is outside 0.0625..1024 MiB; set e.g. 4")
    return max(4096, int(mib * (1 << 20)) // 4096 * 4096)


def _enabled() -> bool:
    return os.environ.get(SHM_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def shm_supported(backend: str) -> bool:
    """True when this process can take part in a shared-memory path for a ``backend`` group
    (Gloo, an x86 CPU, ``SCALEDL_SHM`` not 0)."""
    return _enabled() and not needs_fence() and backend == "gloo"


def open_shm(
    channel: Channel, hosts: Sequence[int], pids: Sequence[int],
) -> ShmGroup | None:
    """Join this rank with the group's other ranks on its host (``hosts``: a host digest per
    group rank; ``pids``: every rank's process id).  Every rank of the group must call this."""
    mine = hosts[channel.rank]
    local = [r for r in range(channel.world_size) if hosts[r] == mine]
    if max(sum(1 for h in hosts if h == host) for host in set(hosts)) < 2:
        return None
    able = int(shm_supported(channel.backend))
    rows = channel.exchange([able, secrets.randbits(62), process_start_time(os.getpid()) or 0])
    if not all(row[0] for row in rows):
        _tell("shared memory is off on some rank (SCALEDL_SHM=0, a non-x86 CPU, or a backend "
              "other than gloo)", quiet=True)
        return None
    window = window_bytes()
    segments = join_segments(channel, local, rows[0][1], window, SLOTS,
                             control_lines(len(local)), pids)
    if segments is None:
        return None
    peers = [Peer(rank, channel.global_ranks[rank], pids[rank], rows[rank][2], segment)
             for rank, segment in zip(local, segments)]
    return ShmGroup(peers, local.index(channel.rank), channel.timeout)


def open_arena(
    channel: Channel, group: ShmGroup | None, hosts: Sequence[int], pids: Sequence[int],
    nbytes: int,
) -> tuple[int, torch.Tensor] | None:
    """An arena of ``nbytes`` in shared memory for this rank, mapped by its host peers: its id
    in ``group`` and this rank's memory as a byte tensor (None on every rank if any rank could
    not make one, and on a rank alone on its host).  Every rank of the group must call this
    once the group's shared memory is open; :meth:`ShmGroup.release_arena` forgets it."""
    mine = hosts[channel.rank]
    local = [r for r in range(channel.world_size) if hosts[r] == mine]
    token = channel.exchange([secrets.randbits(62)])[0][0]
    size = max(4096, -(-nbytes // 4096) * 4096)
    segments = join_segments(channel, local, token, size, 1, 0, pids,
                             "keeps gradient buckets in private memory (copied in and out)")
    if segments is None or group is None:
        return None
    return group.add_arena(segments)


def join_segments(
    channel: Channel, local: Sequence[int], token: int, window: int, slots: int, lines: int,
    pids: Sequence[int], fallback: str = "uses the network path between ranks of one host",
) -> list[Segment] | None:
    """Steps 2-4: create this rank's segment, map its host peers', unlink it; all or none.

    Returns the segments of ``local`` (in that order), or None on every rank if any rank
    failed (the failing rank logs why).  Every rank of the channel must call this; a rank alone
    on its host takes part in the agreement only.
    """
    own = _create(token, channel.rank, window, slots, lines) if len(local) > 1 else None
    failure = own if isinstance(own, str) else ""
    need = Segment.size_of(window, slots, lines)
    if not _agree(channel, failure, "create", need, fallback):
        _discard(own)
        return None
    assert own is None or isinstance(own, Segment)
    segments, failure = _map_peers(own, local, channel, token, window, slots, lines, pids)
    agreed = _agree(channel, failure, "map", need, fallback)
    if own is not None:
        own.path.unlink(missing_ok=True)
    if not agreed or own is None:
        for segment in segments:
            segment.close()
        return None
    return segments


def _create(token: int, rank: int, window: int, slots: int, lines: int) -> Segment | str:
    remove_leftovers()
    try:
        return Segment.create(token, rank, window, slots, lines)
    except SegmentError as error:
        return str(error)


def _map_peers(
    own: Segment | None, local: Sequence[int], channel: Channel, token: int, window: int,
    slots: int, lines: int, pids: Sequence[int],
) -> tuple[list[Segment], str]:
    segments: list[Segment] = []
    if own is None:
        return segments, ""
    for rank in local:
        if rank == channel.rank:
            segments.append(own)
            continue
        path = segment_dir() / f"scaledl-{token:x}-r{rank}-p{pids[rank]}"
        try:
            segments.append(Segment.open(path, token, window, slots, lines, pids[rank]))
        except SegmentError as error:
            return segments, str(error)
    return segments, ""


def _agree(channel: Channel, failure: str, step: str, needed: int, fallback: str) -> bool:
    """Every rank learns whether any failed; the first failing rank's reason is logged."""
    rows = channel.exchange([1 if failure else 0])
    failed = [rank for rank, row in enumerate(rows) if row[0]]
    if not failed:
        return True
    if failure:
        _tell(f"rank {channel.rank} could not {step} its shared-memory segment ({failure}); "
              f"each rank needs about {needed / (1 << 20):.0f} MiB in {segment_dir()}: enlarge "
              f"it (docker run --shm-size=1g, or mount -o remount,size=2g {segment_dir()}) or "
              f"lower {WINDOW_ENV}", fallback)
    return False


def _tell(
    reason: str, fallback: str = "uses the network path between ranks of one host",
    quiet: bool = False,
) -> None:
    text = f"scaledl {fallback}: {reason}"
    if quiet:
        log.info(text)
    else:
        log.warning(text)


def _discard(own: Segment | str | None) -> None:
    if isinstance(own, Segment):
        own.path.unlink(missing_ok=True)
        own.close()
