"""Schedules: a collective algorithm written down as data.

A :class:`Schedule` is what one rank does to run one collective over a flat working buffer of
``numel`` elements: a sequence of :class:`Round` objects, each a set of :class:`Transfer` objects
("send elements [lo, hi) to peer p", "receive [lo, hi) from peer p and reduce into it", "receive
[lo, hi) from peer p and copy into it").  Transfers of one round are posted together and may run
concurrently; rounds run in order.  A round may instead be a :class:`Stage`: a whole
collective of a subgroup run on a chosen path (shared memory inside a host, the backend's own
collective on an axis group), which is how a hierarchical or torus plan runs each level on the
path best for that level's fabric (BlueConnect, PowerAI DDL).  No communication happens while
planning, so a plan can be checked exhaustively in tests, replayed by the simulator, and cached.

Peers are ranks of the process group.  Messages between one pair with one tag are matched in
order, so a sender and its receiver must list their transfers to each other in the same order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Action", "Collective", "Transfer", "Round", "Schedule", "ScheduleError", "Stage", "Path",
    "split", "rounds_from_timed", "stage_round", "flat_plan", "Phases",
]


class Collective(str, enum.Enum):
    """The collectives scaledl implements."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"


class Action(str, enum.Enum):
    """What a transfer does with its slice of the working buffer."""

    SEND = "send"
    RECV_COPY = "recv_copy"
    RECV_REDUCE = "recv_reduce"
    STAGE = "stage"
    """A stage round, as the executor's ops carry it (never a transfer's action)."""


class ScheduleError(ValueError):
    """A plan is inconsistent (internal bug): ranges out of bounds or racing in one round."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """Move the slice ``[lo, hi)`` of the working buffer to or from ``peer``."""

    action: Action
    peer: int
    lo: int
    hi: int
    tag: int = 0

    @property
    def numel(self) -> int:
        """Elements moved."""
        return self.hi - self.lo

    @property
    def is_send(self) -> bool:
        """True for a send."""
        return self.action is Action.SEND


class Path(str, enum.Enum):
    """How a :class:`Stage` moves its bytes."""

    SHM = "shm"
    """Shared memory among ranks of one host (:mod:`scaledl.collectives.shm`)."""
    NATIVE = "native"
    """The backend's own collective on the stage's members (NCCL inside a GPU host)."""


@dataclass(frozen=True, slots=True)
class Stage:
    """A whole collective of a subgroup, run on one path over the slice ``[lo, hi)``.

    ``members`` are group ranks in block order: the slice is cut with :func:`split` into one part
    per member, and for reduce_scatter member ``k`` ends with part ``k`` reduced, for allgather
    member ``k`` contributes part ``k``.  allreduce, broadcast and reduce act on the whole slice
    (``root`` is a group rank, for the rooted ones).  ``level`` is the topology axis whose links
    the stage crosses, which prices it in the cost model.
    """

    collective: Collective
    members: tuple[int, ...]
    lo: int
    hi: int
    path: Path
    level: int = 0
    root: int = -1

    @property
    def numel(self) -> int:
        """Elements of the slice."""
        return self.hi - self.lo

    def parts(self) -> list[tuple[int, int]]:
        """The slice cut into one part per member, in member order."""
        return split(self.lo, self.hi, len(self.members))


@dataclass(frozen=True, slots=True)
class Round:
    """Transfers posted together; the next round starts when all of them completed.  A round
    with a ``stage`` has no transfers: it is that whole sub-collective."""

    transfers: tuple[Transfer, ...]
    stage: Stage | None = None


@dataclass(frozen=True)
class Schedule:
    """Everything one rank does for one collective call, as data."""

    collective: Collective
    algorithm: str
    rank: int
    world_size: int
    numel: int
    """Elements in the working buffer the transfers index into."""
    rounds: tuple[Round, ...]
    layout: tuple[int, ...] | None = None
    """reduce_scatter / allgather only: block index that holds each rank's shard (None: rank r's
    shard is block r)."""

    def __post_init__(self) -> None:
        # Schedules key the plan and op caches on every call: hash the nested tuples once.
        object.__setattr__(self, "_hash", hash((
            self.collective, self.algorithm, self.rank, self.world_size, self.numel,
            self.rounds, self.layout,
        )))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]

    def __getstate__(self) -> dict[str, object]:
        # String hashes differ between processes: never ship the cached one.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def transfers(self) -> Iterable[Transfer]:
        """Every transfer in order."""
        for round_ in self.rounds:
            yield from round_.transfers

    def block_of(self, rank: int) -> int:
        """Index of the block holding ``rank``'s shard (reduce_scatter, allgather)."""
        return rank if self.layout is None else self.layout[rank]

    def validate(self) -> None:
        """Raise :class:`ScheduleError` if a range leaves the buffer or a round races itself."""
        for index, round_ in enumerate(self.rounds):
            if round_.stage is not None:
                self._validate_stage(index, round_)
                continue
            writes: list[tuple[int, int]] = []
            reads: list[tuple[int, int]] = []
            for t in round_.transfers:
                if not 0 <= t.lo < t.hi <= self.numel:
                    raise ScheduleError(f"{self._where(index)}: {t} outside [0, {self.numel})")
                if not 0 <= t.peer < self.world_size or t.peer == self.rank:
                    raise ScheduleError(f"{self._where(index)}: bad peer in {t}")
                (reads if t.is_send else writes).append((t.lo, t.hi))
            _check_disjoint(writes, writes, self._where(index), "two receives")
            _check_disjoint(writes, reads, self._where(index), "a receive and a send")

    def _validate_stage(self, index: int, round_: Round) -> None:
        stage = round_.stage
        assert stage is not None
        if round_.transfers:
            raise ScheduleError(f"{self._where(index)}: a stage round also has transfers")
        if not 0 <= stage.lo <= stage.hi <= self.numel:
            raise ScheduleError(f"{self._where(index)}: {stage} outside [0, {self.numel})")
        if self.rank not in stage.members or len(set(stage.members)) != len(stage.members):
            raise ScheduleError(f"{self._where(index)}: bad members in {stage}")
        rooted = stage.collective in (Collective.BROADCAST, Collective.REDUCE)
        if rooted != (stage.root in stage.members):
            raise ScheduleError(f"{self._where(index)}: bad root in {stage}")

    def stages(self) -> Iterable[Stage]:
        """Every stage step in order."""
        for round_ in self.rounds:
            if round_.stage is not None:
                yield round_.stage

    def _where(self, index: int) -> str:
        return f"{self.algorithm} {self.collective.value} rank {self.rank} round {index}"


def _check_disjoint(
    a: list[tuple[int, int]], b: list[tuple[int, int]], where: str, what: str
) -> None:
    same = a is b
    for i, (lo1, hi1) in enumerate(a):
        for j, (lo2, hi2) in enumerate(b):
            if same and j <= i:
                continue
            if lo1 < hi2 and lo2 < hi1:
                raise ScheduleError(f"{where}: {what} overlap: [{lo1},{hi1}) and [{lo2},{hi2})")


def split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """Cut ``[lo, hi)`` into ``parts`` contiguous ranges whose sizes differ by at most one.

    Earlier ranges get the extra elements; with fewer elements than parts, the last ranges are
    empty.  Every rank computes the same cut, which is what lets plans agree without talking.
    """
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    base, extra = divmod(hi - lo, parts)
    bounds = []
    start = lo
    for index in range(parts):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def make_round(transfers: Iterable[Transfer]) -> Round | None:
    """A round of the non-empty transfers, or None when nothing is left to move."""
    kept = tuple(t for t in transfers if t.hi > t.lo)
    return Round(kept) if kept else None


def rounds_from_timed(timed: Sequence[tuple[int, Transfer]]) -> list[Round]:
    """Group ``(time step, transfer)`` pairs into rounds by time step, dropping empty ones."""
    by_step: dict[int, list[Transfer]] = {}
    for step, transfer in timed:
        by_step.setdefault(step, []).append(transfer)
    rounds = []
    for step in sorted(by_step):
        round_ = make_round(by_step[step])
        if round_ is not None:
            rounds.append(round_)
    return rounds


def join_rounds(*phases: Iterable[Round | None]) -> tuple[Round, ...]:
    """Concatenate phases of rounds, dropping empty ones."""
    return tuple(r for phase in phases for r in phase if r is not None)


def stage_round(stage: Stage) -> Round | None:
    """The round of ``stage``, or None when it has nothing to do (empty slice, one member)."""
    if stage.hi <= stage.lo or len(stage.members) < 2:
        return None
    return Round((), stage)


Phases = Callable[[list[int], int, int], Iterable[Round | None]]
"""Rounds of one collective among ``members`` for ``rank``, given the elements per rank block."""


def flat_plan(
    name: str, collective: Collective, p: int, rank: int, numel: int,
    phases: Mapping[Collective, Phases],
) -> Schedule:
    """The schedule of a flat algorithm (all ``p`` ranks, in rank order) from its phase builders.

    ``numel`` is the tensor for allreduce (the builder gets it whole) and one rank's block for
    reduce_scatter and allgather (the buffer holds ``p`` blocks).
    """
    build = phases.get(collective)
    if build is None:
        raise ValueError(f"{name} does not implement {collective.value}")
    total = numel if collective is Collective.ALLREDUCE else numel * p
    return Schedule(collective, name, rank, p, total, join_rounds(build(list(range(p)), rank,
                                                                        numel)))
