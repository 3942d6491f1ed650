"""Schedules compiled to arrays: the structure the fast replay evaluates.

:func:`compile_schedules` walks every rank's :class:`~scaledl.collectives.schedule.Schedule`
once (the plan objects the executor runs, not a re-implementation) and keeps, as numpy arrays,
each round (a *node*: rank ``r``, round ``i``, id ``r * R + i``) and each transfer, and matches
every receive to its send as the executor does: the k-th message from one peer with one tag
meets the k-th receive posted for it.  Unmatched messages raise
:class:`~scaledl.collectives.schedule.ScheduleError`.  A stage round becomes zero-byte markers
between its members (so it waits for the last of them) and keeps its
:class:`~scaledl.collectives.schedule.Stage`, which the fast replay prices.

:func:`schedules_for` plans a collective for every rank through the registry's planners and
compiles it on the fly, so the rank schedules of a 1024-rank ring never all live at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from scaledl.collectives.registry import lookup, parse_algorithm
from scaledl.collectives.schedule import (Action, Collective, Path, Schedule, ScheduleError,
                                          Stage)
from scaledl.topology import Topology

__all__ = ["Compiled", "compile_schedules", "compile_table", "schedule_rows", "schedules_for"]

Int = np.ndarray


@dataclass(frozen=True)
class Compiled:
    """The rounds and transfers of one collective on every rank, as arrays."""

    world_size: int
    max_rounds: int
    rounds: Int
    """Rounds per rank, shape ``(p,)``."""
    send_node: Int
    send_peer: Int
    send_bytes: Int
    """One entry per send: its node, destination rank and bytes."""
    recv_node: Int
    recv_bytes: Int
    recv_reduce: Int
    """One entry per receive: its node, bytes and whether it reduces (1) or copies (0)."""
    match: Int
    """For each receive, the index of the send it receives."""
    send_virtual: Int | None = None
    """Per send: True for a stage's zero-byte marker (it orders, it moves nothing)."""
    recv_virtual: Int | None = None
    """Per receive: True for a stage's marker."""
    stages: dict[int, Stage] | None = None
    """The stage of every stage node: it starts when all its members reached it."""
    itemsize: int = 4
    """Bytes per element of the stages' slices."""

    @cached_property
    def shared_memory_only(self) -> bool:
        """True when no byte goes through the backend: every send is a stage's marker and every
        stage runs on shared memory (a single-host ``shm`` call)."""
        if self.send_virtual is None:
            moves = bool(np.any(self.send_bytes > 0))
        else:
            moves = bool(np.any((self.send_bytes > 0) & ~self.send_virtual.astype(bool)))
        stages = self.stages.values() if self.stages else ()
        return not moves and all(stage.path == Path.SHM for stage in stages)

    @property
    def send_rank(self) -> Int:
        """The sending rank of each send."""
        return self.send_node // self.max_rounds

    @property
    def send_round(self) -> Int:
        """The round index of each send on its rank."""
        return self.send_node % self.max_rounds

    @property
    def nodes(self) -> int:
        """Size of the padded node grid, ``p * max_rounds``."""
        return self.world_size * self.max_rounds

    def valid(self) -> Int:
        """Boolean mask of the node grid: True where rank ``r`` has round ``i``."""
        grid = np.arange(self.max_rounds)[None, :] < self.rounds[:, None]
        return grid.reshape(-1)


STAGE_SEND, STAGE_RECV = 3, 4
"""Kinds of the zero-byte markers that tie a stage's members together: every member "sends" to
every other at its stage round, so a stage starts when its last member arrives."""


def schedule_rows(
    schedule: Schedule, itemsize: int, stage_ids: dict[tuple[int, ...], int] | None = None,
) -> Int:
    """One row per transfer: ``(round, peer, tag, bytes, kind, position)``, kind 0 = send,
    1 = receive and copy, 2 = receive and reduce; position orders a rank's transfers.  A stage
    round gives a marker send and receive (kinds 3, 4) per other member, tagged ``-1 - id`` of
    its member set (``stage_ids``, shared by every rank's call)."""
    rows: list[tuple[int, int, int, int, int, int]] = []
    reduce_action = Action.RECV_REDUCE
    ids = stage_ids if stage_ids is not None else {}
    for index, round_ in enumerate(schedule.rounds):
        if round_.stage is not None:
            tag = -1 - ids.setdefault(round_.stage.members, len(ids))
            for member in round_.stage.members:
                if member != schedule.rank:
                    rows.append((index, member, tag, 0, STAGE_SEND, len(rows)))
                    rows.append((index, member, tag, 0, STAGE_RECV, len(rows)))
            continue
        for t in round_.transfers:
            kind = 0 if t.is_send else (2 if t.action is reduce_action else 1)
            rows.append((index, t.peer, t.tag, (t.hi - t.lo) * itemsize, kind, len(rows)))
    return np.array(rows, dtype=np.int64).reshape(-1, 6)


def compile_schedules(schedules: Iterable[Schedule], world_size: int, itemsize: int) -> Compiled:
    """Compile one schedule per rank (in rank order) into a :class:`Compiled`."""
    parts: list[Int] = []
    seen = 0
    stage_ids: dict[tuple[int, ...], int] = {}
    stages: dict[tuple[int, int], Stage] = {}
    for schedule in schedules:
        if schedule.rank != seen:
            raise ValueError(
                f"schedules must come in rank order; got rank {schedule.rank} at {seen}"
            )
        rows = schedule_rows(schedule, itemsize, stage_ids)
        parts.append(np.concatenate([np.full((len(rows), 1), seen, dtype=np.int64), rows], axis=1))
        for index, round_ in enumerate(schedule.rounds):
            if round_.stage is not None:
                stages[(seen, index)] = round_.stage
        seen += 1
    if seen != world_size:
        raise ValueError(f"got {seen} schedules for a world of {world_size} ranks")
    compiled = compile_table(np.concatenate(parts) if parts else np.zeros((0, 7), np.int64),
                             world_size)
    if not stages:
        return compiled
    by_node = {rank * compiled.max_rounds + index: stage for (rank, index), stage in stages.items()}
    return replace(compiled, stages=by_node, itemsize=itemsize)


def compile_table(table: Int, world_size: int) -> Compiled:
    """Compile rows ``(rank, round, peer, tag, bytes, kind, position)`` of every rank."""
    rounds = np.zeros(world_size, dtype=np.int64)
    if len(table):
        np.maximum.at(rounds, table[:, 0], table[:, 1] + 1)
    max_rounds = max(int(rounds.max(initial=0)), 1)
    return _build(table, rounds, world_size, max_rounds)


def _build(table: Int, rounds: Int, p: int, max_rounds: int) -> Compiled:
    rank, index, peer, tag, nbytes, kind, order = table.T
    node = rank * max_rounds + index
    sends = (kind == 0) | (kind == STAGE_SEND)
    recvs = ~sends
    # Match the k-th send of (src, dst, tag) with the k-th receive of (src, dst, tag).
    s_idx = np.flatnonzero(sends)
    r_idx = np.flatnonzero(recvs)
    s_order = np.lexsort((order[s_idx], tag[s_idx], peer[s_idx], rank[s_idx]))
    r_order = np.lexsort((order[r_idx], tag[r_idx], rank[r_idx], peer[r_idx]))
    s_sorted, r_sorted = s_idx[s_order], r_idx[r_order]
    s_keys = np.stack([rank[s_sorted], peer[s_sorted], tag[s_sorted]], axis=1)
    r_keys = np.stack([peer[r_sorted], rank[r_sorted], tag[r_sorted]], axis=1)
    if len(s_sorted) != len(r_sorted) or not np.array_equal(s_keys, r_keys):
        raise ScheduleError(_unmatched(s_keys, r_keys))
    if not np.array_equal(nbytes[s_sorted], nbytes[r_sorted]):
        bad = int(np.flatnonzero(nbytes[s_sorted] != nbytes[r_sorted])[0])
        src, dst = int(s_keys[bad, 0]), int(s_keys[bad, 1])
        raise ScheduleError(f"rank {src} sends {int(nbytes[s_sorted][bad])} bytes to rank {dst}, "
                            f"which expects {int(nbytes[r_sorted][bad])}")
    # Position of each send in the send arrays (which keep table order).
    send_pos = np.empty(len(table), dtype=np.int64)
    send_pos[s_idx] = np.arange(len(s_idx))
    recv_pos = np.empty(len(table), dtype=np.int64)
    recv_pos[r_idx] = np.arange(len(r_idx))
    match = np.empty(len(r_idx), dtype=np.int64)
    match[recv_pos[r_sorted]] = send_pos[s_sorted]
    return Compiled(
        world_size=p, max_rounds=max_rounds, rounds=rounds,
        send_node=node[s_idx], send_peer=peer[s_idx], send_bytes=nbytes[s_idx],
        recv_node=node[r_idx], recv_bytes=nbytes[r_idx], recv_reduce=(kind[r_idx] == 2).astype(
            np.int64), match=match, send_virtual=kind[s_idx] == STAGE_SEND,
        recv_virtual=kind[r_idx] == STAGE_RECV,
    )


def _unmatched(s_keys: Int, r_keys: Int) -> str:
    sent = {tuple(int(v) for v in row) for row in s_keys}
    posted = {tuple(int(v) for v in row) for row in r_keys}
    lonely_sends = sorted(sent - posted)[:5]
    lonely_recvs = sorted(posted - sent)[:5]
    if lonely_recvs and not lonely_sends:
        return f"replay deadlocked: receives (source, dest, tag) {lonely_recvs} are never sent"
    if lonely_sends:
        return f"replay: sends never received on (source, dest, tag) {lonely_sends}"
    return "replay: a (source, dest, tag) pair sends and receives different numbers of messages"


def schedules_for(
    algorithm: str, collective: Collective, topology: Topology, numel: int, root: int = 0,
) -> Iterable[Schedule]:
    """Every rank's schedule of ``algorithm``, planned one rank at a time (not cached)."""
    algo = lookup(algorithm, collective)
    if algo.planner is None:
        raise ValueError(
            f"algorithm {algorithm!r} is the backend's own collective and has no schedule to "
            "simulate; pick a scheduled one such as ring, halving_doubling, tree or torus"
        )
    _, paths = parse_algorithm(algorithm)
    for rank in range(topology.world_size):
        if paths:
            yield algo.planner(collective, topology, rank, numel, root, paths=paths)
        else:
            yield algo.planner(collective, topology, rank, numel, root)
