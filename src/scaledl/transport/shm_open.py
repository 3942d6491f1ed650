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

from scaledl.transport.channel import Channel
from scaledl.transport.shm import Peer, ShmGroup, control_lines
from scaledl.transport.shm_segment import (
    Segment, SegmentError, needs_fence, process_start_time, remove_leftovers, segment_dir,
)

__all__ = [
    "open_shm", "shm_supported", "SHM_ENV", "WINDOW_ENV", "DEFAULT_WINDOW_MB", "window_bytes",
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
        _tell(channel, "shared memory is off on some rank (SCALEDL_SHM=0, a non-x86 CPU, or a "
                       "backend other than gloo)", quiet=True)
        return None
    token, window = rows[0][1], window_bytes()
    lines = control_lines(len(local))
    own = _create(token, channel.rank, window, lines) if len(local) > 1 else None
    failure = own if isinstance(own, str) else ""
    if not _agree(channel, failure, "create"):
        _discard(own)
        return None
    assert own is None or isinstance(own, Segment)
    peers, failure = _map_peers(own, local, channel, token, window, lines, pids, rows)
    agreed = _agree(channel, failure, "map")
    if own is not None:
        own.path.unlink(missing_ok=True)
    if not agreed or own is None:
        for peer in peers:
            peer.segment.close()
        return None
    return ShmGroup(peers, local.index(channel.rank), channel.timeout)


def _create(token: int, rank: int, window: int, lines: int) -> Segment | str:
    remove_leftovers()
    try:
        return Segment.create(token, rank, window, SLOTS, lines)
    except SegmentError as error:
        return str(error)


def _map_peers(
    own: Segment | None, local: list[int], channel: Channel, token: int, window: int,
    lines: int, pids: Sequence[int], rows: list[list[int]],
) -> tuple[list[Peer], str]:
    peers: list[Peer] = []
    if own is None:
        return peers, ""
    for rank in local:
        global_rank = channel.global_ranks[rank]
        if rank == channel.rank:
            peers.append(Peer(rank, global_rank, pids[rank], rows[rank][2], own))
            continue
        path = segment_dir() / f"scaledl-{token:x}-r{rank}-p{pids[rank]}"
        try:
            segment = Segment.open(path, token, window, SLOTS, lines, pids[rank])
        except SegmentError as error:
            return peers, str(error)
        peers.append(Peer(rank, global_rank, pids[rank], rows[rank][2], segment))
    return peers, ""


def _agree(channel: Channel, failure: str, step: str) -> bool:
    """Every rank learns whether any failed; the first failing rank's reason is logged."""
    rows = channel.exchange([1 if failure else 0])
    failed = [rank for rank, row in enumerate(rows) if row[0]]
    if not failed:
        return True
    if failure:
        needed = window_bytes() * SLOTS
        _tell(channel, f"rank {channel.rank} could not {step} its shared-memory segment "
                       f"({failure}); each rank needs about {needed / (1 << 20):.0f} MiB in "
                       f"{segment_dir()}: enlarge it (docker run --shm-size=1g, or mount -o "
                       f"remount,size=2g {segment_dir()}) or lower {WINDOW_ENV}")
    return False


def _tell(channel: Channel, reason: str, quiet: bool = False) -> None:
    text = f"scaledl uses the network path between ranks of one host: {reason}"
    if quiet:
        log.info(text)
    else:
        log.warning(text)


def _discard(own: Segment | str | None) -> None:
    if isinstance(own, Segment):
        own.path.unlink(missing_ok=True)
        own.close()
