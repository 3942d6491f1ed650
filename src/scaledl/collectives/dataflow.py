"""Dataflow execution of a schedule: chunks move as soon as their data is ready, across rounds.

A schedule's rounds are cut into *ops* (one chunk of one transfer each), in the order a
round-by-round executor would post them.  Each op records the last earlier op it depends on:

- a send reads its range, so it waits for earlier receives into that range (read after write);
- a receive-and-copy writes its range as the bytes land, so it waits for earlier sends reading
  the range (write after read) and earlier receives writing it (write after write);
- a receive-and-reduce lands in scratch and is reduced into the buffer only when it is waited
  for, so it needs no buffer dependency, only a free scratch slot.

The loop then alternates two steps until every op is complete: post every op whose dependency is
complete (keeping, per peer, tag and direction, the schedule's order, which is how messages are
matched; per peer and direction alone on a transport that ignores tags, as NCCL does); wait for
the next op in schedule order and, for a receive-and-reduce, reduce it.
Completions are taken in schedule order, so an op is complete exactly when its index is below
the cursor, and the loop never waits for anything a round-by-round executor would not already
have waited for: it cannot deadlock where that one does not.  What it gains: the ring's step
``s + 1`` sends chunk ``j`` as soon as step ``s`` has reduced it, so one slow chunk no longer
holds up a whole round, and reduction overlaps transfers across round boundaries.

Gloo's point-to-point works report completion only through ``wait()`` (no futures, and
``is_completed()`` stays false until waited), which is why completions are consumed in order
rather than as they happen.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import torch

from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.schedule import Action, Schedule, Stage
from scaledl.transport.base import Handle, Transport

__all__ = [
    "Op", "Program", "StageRunner", "build_ops", "compile_schedule", "run_ops", "DEFAULT_WINDOW",
]

DEFAULT_WINDOW = 32
"""Receive-and-reduce chunks in flight at once (each holds one scratch slot)."""


@dataclass(frozen=True, slots=True)
class Op:
    """One chunk of one transfer, or one whole stage."""

    action: Action
    peer: int
    tag: int
    lo: int
    hi: int
    ready_after: int
    """Index of the last earlier op that must complete before this one is posted (-1: none)."""
    stage: Stage | None = None
    """The sub-collective of a stage op (it runs when the cursor reaches it)."""


class StageRunner(Protocol):
    """Runs the stage steps of a schedule (the communicator provides one)."""

    def run(self, stage: Stage, buffer: torch.Tensor, op: ReduceOp) -> None:
        """Run ``stage`` on ``buffer`` (blocking)."""
        ...


def build_ops(schedule: Schedule, chunk_numel: int) -> tuple[Op, ...]:
    """Cut ``schedule`` into chunk ops in posting order, with their dependencies.

    A stage runs when the cursor reaches it (every earlier op is then complete), and a later op
    that touches its slice waits for it, as for a receive that rewrites the slice; later ops on
    other slices may be posted before it runs, so a pipelined plan overlaps a stage (CPU work
    through shared memory) with transfers in flight.
    """
    ops: list[Op] = []
    history: list[tuple[int, int, bool]] = []  # (lo, hi, writes) of every earlier op
    for round_ in schedule.rounds:
        if round_.stage is not None:
            stage = round_.stage
            after = _last_conflict(history, stage.lo, stage.hi, Action.RECV_COPY)
            ops.append(Op(Action.STAGE, -1, 0, stage.lo, stage.hi, after, stage))
            history.append((stage.lo, stage.hi, True))
            continue
        pieces = [
            [(a, min(t.hi, a + chunk_numel)) for a in range(t.lo, t.hi, chunk_numel)]
            for t in round_.transfers
        ]
        for j in range(max(len(p) for p in pieces)):
            for t, chunks in zip(round_.transfers, pieces):
                if j < len(chunks):
                    lo, hi = chunks[j]
                    ops.append(Op(t.action, t.peer, t.tag, lo, hi, _last_conflict(
                        history, lo, hi, t.action)))
                    history.append((lo, hi, not t.is_send))
    return tuple(ops)


@dataclass(frozen=True)
class Program:
    """A schedule compiled for one chunk size: its ops and what the loop derives from them."""

    ops: tuple[Op, ...]
    queues: tuple[tuple[int, ...], ...]
    """Op indices per (direction, peer, tag), each in schedule order."""
    reduces: tuple[int, ...]
    """Indices of the receive-and-reduce ops, in schedule order."""
    slot_numel: int
    """Largest receive-and-reduce chunk: the size of one scratch slot."""


@lru_cache(maxsize=512)
def compile_schedule(schedule: Schedule, chunk_numel: int, by_peer: bool = False) -> Program:
    """The ops of ``schedule`` cut at ``chunk_numel`` and their queues (cached).

    Queues are per (direction, peer, tag); with ``by_peer`` (a transport that ignores tags,
    like NCCL) per (direction, peer), so each peer's messages are posted in schedule order.
    """
    ops = build_ops(schedule, chunk_numel)
    queues: dict[tuple[bool, int, int], list[int]] = {}
    for index, op in enumerate(ops):
        if op.action is Action.STAGE:
            continue
        tag = 0 if by_peer else op.tag
        queues.setdefault((op.action is Action.SEND, op.peer, tag), []).append(index)
    reduces = tuple(i for i, op in enumerate(ops) if op.action is Action.RECV_REDUCE)
    slot_numel = max((ops[i].hi - ops[i].lo for i in reduces), default=0)
    return Program(ops, tuple(tuple(q) for q in queues.values()), reduces, slot_numel)


def _last_conflict(history: list[tuple[int, int, bool]], lo: int, hi: int, action: Action) -> int:
    if action is Action.RECV_REDUCE:
        return -1
    for index in range(len(history) - 1, -1, -1):
        other_lo, other_hi, writes = history[index]
        if other_lo < hi and lo < other_hi and (writes or action is Action.RECV_COPY):
            return index
    return -1


class _Poster:
    """Posts ready ops, queue by queue, in schedule order within each queue."""

    def __init__(
        self, program: Program, buffer: torch.Tensor, transport: Transport,
        scratch: torch.Tensor, window: int, stages: StageRunner | None,
    ) -> None:
        self.ops, self.buffer, self.transport = program.ops, buffer, transport
        self.stages = stages
        self.scratch, self.slot_numel = scratch, program.slot_numel
        self.free_slots = list(range(window - 1, -1, -1))
        self.handles: list[Handle | None] = [None] * len(program.ops)
        self.slot_of: dict[int, int] = {}
        self.queues = [deque(queue) for queue in program.queues]
        self.reduces = deque(program.reduces)

    def post_ready(self, cursor: int) -> None:
        any_posted = progress = False
        while True:
            progress = False
            for queue in self.queues:
                while queue and self._ready(queue[0], cursor):
                    self._post(queue.popleft())
                    progress = any_posted = True
            if not progress:
                break
        if any_posted:
            self.transport.commit()

    def _ready(self, index: int, cursor: int) -> bool:
        op = self.ops[index]
        if op.ready_after >= cursor:
            return False
        if op.action is Action.RECV_REDUCE:
            # Scratch slots go to reduces in schedule order, so the one the cursor waits for
            # always gets a slot once the earlier ones are reduced.
            return bool(self.free_slots) and self.reduces[0] == index
        return True

    def _post(self, index: int) -> None:
        op = self.ops[index]
        if op.action is Action.SEND:
            handle = self.transport.queue_send(self.buffer[op.lo:op.hi], op.peer, op.tag)
        elif op.action is Action.RECV_COPY:
            handle = self.transport.queue_recv(self.buffer[op.lo:op.hi], op.peer, op.tag)
        else:
            self.reduces.popleft()
            slot = self.free_slots.pop()
            self.slot_of[index] = slot
            landing = self.landing(index)
            handle = self.transport.queue_recv(landing, op.peer, op.tag)
        self.handles[index] = handle

    def landing(self, index: int) -> torch.Tensor:
        op = self.ops[index]
        start = self.slot_of[index] * self.slot_numel
        return self.scratch[start:start + (op.hi - op.lo)]

    def complete(self, index: int, op_kind: ReduceOp) -> None:
        stage = self.ops[index].stage
        if stage is not None:
            if self.stages is None:
                raise ValueError(f"the schedule has a {stage.path.value} stage but no stage "
                                 "runner was given to the executor")
            self.stages.run(stage, self.buffer, op_kind)
            return
        handle = self.handles[index]
        assert handle is not None, f"op {index} waited for before it was posted"
        handle.wait()
        op = self.ops[index]
        if op.action is Action.RECV_REDUCE:
            op_kind.combine(self.buffer[op.lo:op.hi], self.landing(index))
            self.free_slots.append(self.slot_of.pop(index))
        self.handles[index] = None


def run_ops(
    program: Program, buffer: torch.Tensor, transport: Transport, op: ReduceOp,
    scratch: torch.Tensor, window: int, stages: StageRunner | None = None,
) -> None:
    """Execute ``program`` on ``buffer``; ``scratch`` holds ``window`` slots of
    ``program.slot_numel`` elements; ``stages`` runs its stage steps."""
    poster = _Poster(program, buffer, transport, scratch, window, stages)
    for cursor in range(len(program.ops)):
        poster.post_ready(cursor)
        poster.complete(cursor, op)
