"""Replay: run every rank's schedule of one collective in virtual time.

Each rank works through its rounds in order.  A round starts when the rank's previous round has
ended; its sends leave at that moment; a receive completes when the matching send (the k-th
message from that peer with that tag) has crossed the link: ``send start + alpha + bytes *
beta`` of the link class, and not before the receiver posted it.  A round ends when all of its
transfers have, plus the executor's per-round overhead and the part of the reduction the chunk
pipeline does not hide.  The makespan over ranks is the collective's predicted time, including
the time ranks spend waiting for each other, which a per-rank sum misses (a pipelined chain has
two rounds on its root but ``2(p-1)`` hops end to end).  A rank's sends of one round over one
link class share that link's bandwidth (one network interface per rank), so splitting a message
over two rings to two neighbours moves it no faster; receives do not compete with sends
(full-duplex links).  Given ``node_of``, the ranks of a host that send off the host in the same
round (by round index) share the host's interface; contention inside the network is left to
``scaledl.sim``.

A stage round (a whole sub-collective on a path) starts when every member has reached it (the
``k``-th stage a rank runs among some members meets the ``k``-th stage of each of them) and ends
``stage_time(stage, sharers)`` later on all of them (``sharers``: the host's ranks whose stages
of that round leave the host and so share its interface).

The replay also checks the plans against each other: every send must meet a receive of the same
size, every stage the same stage on its other members, and no rank may wait forever (a deadlock
raises :class:`ScheduleError`).  Links are modelled without contention here; ``scaledl.sim`` adds
shared links on top of the same schedules.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scaledl.collectives.cost import LinkCost
from scaledl.collectives.schedule import Action, Schedule, ScheduleError, Stage, Transfer

__all__ = ["ReplayResult", "replay", "LinkOf"]


@dataclass(frozen=True)
class ReplayResult:
    """Predicted finishing time of each rank; ``makespan`` is the slowest."""

    finish: tuple[float, ...]

    @property
    def makespan(self) -> float:
        """Seconds until the last rank is done."""
        return max(self.finish, default=0.0)


LinkOf = Callable[[int, int], LinkCost]
"""The cost of the link between two ranks."""


def _outgoing(
    rank: int, transfers: Sequence[Transfer], link_of: LinkOf, itemsize: int, sharers: int = 1,
    node_of: Callable[[int], int] | None = None,
) -> dict[LinkCost, float]:
    """Bytes ``rank`` sends in one round, per link class: they leave through one interface.

    Sends that leave the host count ``sharers`` times: that many ranks of the host use its
    network interface in the same round.
    """
    totals: dict[LinkCost, float] = {}
    for t in transfers:
        if t.is_send:
            link = link_of(rank, t.peer)
            leaves = node_of is not None and node_of(rank) != node_of(t.peer)
            weight = sharers if leaves else 1
            totals[link] = totals.get(link, 0) + t.numel * itemsize * weight
    return totals


def _host_sharers(
    schedules: Sequence[Schedule], node_of: Callable[[int], int] | None
) -> dict[tuple[int, int], int]:
    """(node, round index) -> how many of the node's ranks send off the host in that round (by
    transfers, or by a stage whose members span hosts)."""
    if node_of is None:
        return {}
    counts: dict[tuple[int, int], int] = {}
    for schedule in schedules:
        node = node_of(schedule.rank)
        for index, round_ in enumerate(schedule.rounds):
            peers = round_.stage.members if round_.stage is not None else [
                t.peer for t in round_.transfers if t.is_send]
            if any(node_of(peer) != node for peer in peers):
                counts[(node, index)] = counts.get((node, index), 0) + 1
    return counts


def _index_sends(
    schedules: Sequence[Schedule],
) -> dict[tuple[int, int, int], deque[tuple[int, Transfer]]]:
    """For each (source, destination, tag): the source's sends in order, with their round."""
    sends: dict[tuple[int, int, int], deque[tuple[int, Transfer]]] = {}
    for schedule in schedules:
        for index, round_ in enumerate(schedule.rounds):
            for t in round_.transfers:
                if t.is_send:
                    key = (schedule.rank, t.peer, t.tag)
                    sends.setdefault(key, deque()).append((index, t))
    return sends


def _index_stages(schedules: Sequence[Schedule]) -> dict[tuple[int, int], tuple[int, ...]]:
    """(rank, round index) of every stage -> the round index of that stage on each member."""
    occurrences: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for schedule in schedules:
        for index, round_ in enumerate(schedule.rounds):
            if round_.stage is not None:
                key = (schedule.rank, round_.stage.members)
                occurrences.setdefault(key, []).append(index)
    matched: dict[tuple[int, int], tuple[int, ...]] = {}
    for (rank, members), indices in occurrences.items():
        for k, index in enumerate(indices):
            peers = [occurrences.get((m, members), []) for m in members]
            if any(len(found) <= k for found in peers):
                raise ScheduleError(f"rank {rank}'s stage {k} among {members} has no partner")
            matched[(rank, index)] = tuple(found[k] for found in peers)
    return matched


def replay(
    schedules: Sequence[Schedule], link_of: LinkOf, itemsize: int, overhead: float = 0.0,
    gamma: float = 0.0, chunk_bytes: int = 1 << 20, node_of: Callable[[int], int] | None = None,
    stage_time: Callable[[Stage, int], float] | None = None,
) -> ReplayResult:
    """Replay ``schedules`` (one per rank, in rank order) and return each rank's finish time.

    With ``node_of``, ranks of one host share its interface for messages that leave the host;
    ``stage_time(stage, sharers)`` prices stage rounds (required when a schedule has one), with
    ``sharers`` the ranks of the host whose stages of that round leave the host.
    """
    p = len(schedules)
    context = _Context(schedules, link_of, itemsize, overhead, gamma, chunk_bytes, node_of,
                       _host_sharers(schedules, node_of), _index_stages(schedules), stage_time)
    pending = _index_sends(schedules)
    # starts[r][i]: when rank r began round i; known as soon as r reaches it.
    starts: list[list[float | None]] = [[None] * len(s.rounds) for s in schedules]
    position = [0] * p
    clock = [0.0] * p
    for rank in range(p):
        if starts[rank]:
            starts[rank][0] = 0.0
    progress = True
    while progress:
        progress = False
        for rank in range(p):
            rounds = len(schedules[rank].rounds)
            while position[rank] < rounds and _try_round(
                context, rank, position[rank], starts, pending, clock
            ):
                position[rank] += 1
                if position[rank] < rounds:
                    starts[rank][position[rank]] = clock[rank]
                progress = True
    stuck = [r for r in range(p) if position[r] < len(schedules[r].rounds)]
    if stuck:
        raise ScheduleError(f"replay deadlocked: ranks {stuck} wait for messages never sent")
    leftovers = [key for key, queue in pending.items() if queue]
    if leftovers:
        raise ScheduleError(f"replay: sends never received on (source, dest, tag) {leftovers}")
    return ReplayResult(tuple(clock))


@dataclass(frozen=True)
class _Context:
    schedules: Sequence[Schedule]
    link_of: LinkOf
    itemsize: int
    overhead: float
    gamma: float
    chunk_bytes: int
    node_of: Callable[[int], int] | None
    sharers: dict[tuple[int, int], int]
    stages: dict[tuple[int, int], tuple[int, ...]]
    stage_time: Callable[[Stage, int], float] | None

    def outgoing(self, rank: int, index: int) -> dict[LinkCost, float]:
        node = self.node_of(rank) if self.node_of is not None else 0
        return _outgoing(rank, self.schedules[rank].rounds[index].transfers, self.link_of,
                         self.itemsize, self.sharers.get((node, index), 1), self.node_of)


def _try_round(
    ctx: _Context, rank: int, index: int, starts: list[list[float | None]],
    pending: dict[tuple[int, int, int], deque[tuple[int, Transfer]]], clock: list[float],
) -> bool:
    """Complete round ``index`` of ``rank`` if every message it waits for has been sent."""
    round_ = ctx.schedules[rank].rounds[index]
    if round_.stage is not None:
        return _try_stage(ctx, rank, index, round_.stage, starts, clock)
    link_of, itemsize = ctx.link_of, ctx.itemsize
    start = clock[rank]
    matched: list[tuple[Transfer, int, Transfer]] = []
    for t in round_.transfers:
        if t.is_send:
            continue
        queue = pending.get((t.peer, rank, t.tag))
        if not queue:
            return False
        send_round, send = queue[0]
        if starts[t.peer][send_round] is None:
            return False
        matched.append((t, send_round, send))
    end = start
    reduced = 0
    for t, send_round, send in matched:
        pending[(t.peer, rank, t.tag)].popleft()
        if send.numel != t.numel:
            raise ScheduleError(
                f"rank {t.peer} sends {send.numel} elements to rank {rank}, which expects {t.numel}"
            )
        link = link_of(t.peer, rank)
        sent_at = starts[t.peer][send_round]
        assert sent_at is not None
        # The sender's concurrent sends over this link class share its injection bandwidth.
        shared = ctx.outgoing(t.peer, send_round)[link]
        end = max(end, start, sent_at + link.alpha + shared * link.beta)
        if t.action is Action.RECV_REDUCE:
            reduced += t.numel * itemsize
    for link, nbytes in ctx.outgoing(rank, index).items():
        end = max(end, start + link.alpha + nbytes * link.beta)
    gamma = ctx.gamma
    end = max(end, start + reduced * gamma) + min(reduced, ctx.chunk_bytes) * gamma + ctx.overhead
    clock[rank] = end
    return True


def _try_stage(
    ctx: _Context, rank: int, index: int, stage: Stage, starts: list[list[float | None]],
    clock: list[float],
) -> bool:
    """Complete a stage round once every member has started its matching stage."""
    if ctx.stage_time is None:
        raise ScheduleError("replay needs stage_time to price a schedule with stages")
    begun = []
    for member, member_index in zip(stage.members, ctx.stages[(rank, index)]):
        theirs = ctx.schedules[member].rounds[member_index].stage
        if theirs is None or (theirs.collective, theirs.lo, theirs.hi, theirs.path) != (
            stage.collective, stage.lo, stage.hi, stage.path
        ):
            raise ScheduleError(f"rank {rank} and rank {member} disagree on a stage: {stage}")
        started = starts[member][member_index]
        if started is None:
            return False
        begun.append(started)
    node = ctx.node_of(rank) if ctx.node_of is not None else 0
    clock[rank] = max(begun) + ctx.stage_time(stage, ctx.sharers.get((node, index), 1))
    return True
