"""Fault injection: make a chosen rank crash, hang, raise or slow down, to rehearse failures.

A fault plan is read once per process from ``SCALEDL_FAULT`` (``scaledl train --inject-fault``
sets it for every worker).  One fault is a comma-separated list of ``key:value`` fields;
several faults are separated by ``;``::

    SCALEDL_FAULT="rank:1,step:5,kind:crash"          # rank 1 is SIGKILLed before step 5
    SCALEDL_FAULT="rank:0,collective:40,kind:hang"    # rank 0 hangs inside its 40th collective
    SCALEDL_FAULT="rank:2,step:30,kind:slow:3"        # rank 2 sleeps 3 s before step 30
    SCALEDL_FAULT="rank:2,step:12,kind:lose"          # rank 2's host is lost for good

Fields:

- ``rank``: the global rank that fails (required).
- ``step:N`` or ``collective:N`` (exactly one): just before training step ``N`` (numbered as in
  ``metrics.jsonl``: the first step is 1), or inside this rank's ``N``-th scaledl collective
  call (counted from 1, every collective of every group; the hook is :func:`at_collective`).
- ``kind``: ``crash`` (SIGKILL, as a power loss), ``hang`` (the calling thread blocks forever;
  the process stays alive and silent), ``raise`` (:class:`InjectedFault`, a ``RuntimeError``),
  ``slow:SECONDS`` (sleep once, then go on), ``lose`` (the worker's host is lost: its
  torchelastic agent and then the worker are SIGKILLed, so the worker never comes back; only
  under a torchelastic agent).
- ``attempt``: the restart attempt in which the fault fires (default 0, the first run, so a
  fault does not fire again after the restart it causes; ``*``: every attempt).  The attempt is
  the agent's ``TORCHELASTIC_RESTART_COUNT`` plus ``SCALEDL_RELAUNCH`` (whole-job relaunches by
  ``scaledl train``).

Nothing here runs when ``SCALEDL_FAULT`` is unset: the hooks cost one attribute check.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "FAULT_ENV", "KINDS", "Fault", "InjectedFault", "parse_faults", "check_fault_spec",
    "fault_problem", "at_step", "at_collective", "reset",
]

log = logging.getLogger(__name__)

FAULT_ENV = "SCALEDL_FAULT"
"""Environment variable holding the fault plan."""
RELAUNCH_ENV = "SCALEDL_RELAUNCH"
"""Whole-job relaunches so far (set by ``scaledl train``'s launcher); part of the attempt."""
KINDS = ("crash", "hang", "raise", "slow", "lose")
"""What a fault does (see the module docstring)."""
_FIELDS = ("rank", "step", "collective", "kind", "attempt")


class InjectedFault(RuntimeError):
    """Raised by a ``kind:raise`` fault."""


@dataclass(frozen=True)
class Fault:
    """One planned failure."""

    rank: int
    """Global rank that fails."""
    kind: str
    """One of :data:`KINDS`."""
    step: int | None = None
    """Training step before which it fires (1-based), or None."""
    collective: int | None = None
    """This rank's collective call inside which it fires (1-based), or None."""
    seconds: float = 0.0
    """Sleep of a ``slow`` fault."""
    attempt: int | None = 0
    """Attempt in which it fires; None: every attempt."""

    def describe(self) -> str:
        """``crash of rank 1 before step 5`` and the like."""
        where = f"before step {self.step}" if self.step is not None else \
            f"in collective call {self.collective}"
        what = f"slow ({self.seconds:g} s)" if self.kind == "slow" else self.kind
        return f"injected {what} of rank {self.rank} {where}"


def _number(key: str, value: str, text: str, minimum: int) -> int:
    if not value.strip().isdigit() or int(value) < minimum:
        raise ValueError(f"{FAULT_ENV} {text!r}: {key}:{value} must be a whole number >= "
                         f"{minimum}, e.g. rank:1,step:5,kind:crash")
    return int(value)


def _kind(value: str, text: str) -> tuple[str, float]:
    name, _, seconds = value.partition(":")
    if name not in KINDS:
        raise ValueError(f"{FAULT_ENV} {text!r}: kind:{value} is unknown; use one of "
                         f"{', '.join(KINDS)} (slow takes seconds, e.g. kind:slow:2)")
    if name != "slow":
        if seconds:
            raise ValueError(f"{FAULT_ENV} {text!r}: kind:{name} takes no value; write "
                             f"kind:{name}")
        return name, 0.0
    try:
        delay = float(seconds)
    except ValueError:
        delay = -1.0
    if not delay > 0:
        raise ValueError(f"{FAULT_ENV} {text!r}: kind:slow needs a positive number of seconds, "
                         "e.g. kind:slow:2")
    return name, delay


def _parse_one(text: str) -> Fault:
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, colon, value = item.strip().partition(":")
        if not colon or key not in _FIELDS or key in fields:
            raise ValueError(f"{FAULT_ENV} {text!r}: {item.strip()!r} is not one of the fields "
                             f"{', '.join(k + ':' for k in _FIELDS)} (each once), e.g. "
                             "rank:1,step:5,kind:crash")
        fields[key] = value.strip()
    missing = [key + ":" for key in ("rank", "kind") if key not in fields]
    if missing:
        raise ValueError(f"{FAULT_ENV} {text!r} needs {' and '.join(missing)} too (kind: one of "
                         "crash, hang, raise, slow:S, lose), e.g. rank:1,step:5,kind:crash")
    if ("step" in fields) == ("collective" in fields):
        raise ValueError(f"{FAULT_ENV} {text!r} needs exactly one of step:N or collective:N")
    kind, seconds = _kind(fields["kind"], text)
    attempt = fields.get("attempt", "0")
    return Fault(
        rank=_number("rank", fields["rank"], text, 0), kind=kind, seconds=seconds,
        step=_number("step", fields["step"], text, 1) if "step" in fields else None,
        collective=(_number("collective", fields["collective"], text, 1)
                    if "collective" in fields else None),
        attempt=None if attempt == "*" else _number("attempt", attempt, text, 0),
    )


def parse_faults(text: str) -> tuple[Fault, ...]:
    """The faults of a plan (``;``-separated); ``ValueError`` naming a malformed one."""
    return tuple(_parse_one(part) for part in text.split(";") if part.strip())


def fault_problem(fault: Fault, world_size: int | None = None, steps: int | None = None,
                  training_ranks: int | None = None) -> str | None:
    """Why ``fault`` can never fire in a job of ``world_size`` ranks, of which the first
    ``training_ranks`` train (the others serve parameters) for ``steps`` steps; None when it
    can, or when what would tell is not given.  The reason names the value and the fix."""
    if world_size is not None and fault.rank >= world_size:
        return (f"rank:{fault.rank} is outside the {world_size} workers; name a rank in "
                f"0..{world_size - 1}")
    if fault.step is None:
        return None
    if training_ranks is not None and fault.rank >= training_ranks:
        return (f"rank:{fault.rank} serves parameters and takes no training step, so "
                f"step:{fault.step} never comes; name a training rank in "
                f"0..{training_ranks - 1}, or collective:N")
    if steps is not None and fault.step > steps:
        return (f"step:{fault.step} is beyond the run's {steps} training steps, so the fault "
                f"would never fire; name a step in 1..{steps} or train for more epochs")
    return None


def check_fault_spec(
    text: str,
    world_size: int | None = None,
    *,
    steps: int | None = None,
    training_ranks: int | None = None,
    source: str = FAULT_ENV,
) -> tuple[Fault, ...]:
    """:func:`parse_faults`, refusing a plan with no fault or with a fault that cannot fire
    (:func:`fault_problem`, for what is given); ``source`` names where the plan came from in
    the message (the variable, or ``--inject-fault``)."""
    try:
        faults = parse_faults(text)
    except ValueError as error:  # name what the user typed, not the variable it travels in
        if source == FAULT_ENV:
            raise
        raise ValueError(str(error).replace(FAULT_ENV, source, 1)) from None
    if not faults:
        raise ValueError(f"{source} {text!r} names no fault; write e.g. "
                         "rank:1,step:5,kind:crash")
    for fault in faults:
        problem = fault_problem(fault, world_size, steps, training_ranks)
        if problem is not None:
            raise ValueError(f"{source} {text!r}: {problem}")
    return faults


# -- the process's plan -------------------------------------------------------------------------
class _Plan:
    """The faults of this process that are still armed, and the collective counter."""

    def __init__(self, faults: tuple[Fault, ...], rank: int, attempt: int) -> None:
        self.armed = [f for f in faults
                      if f.rank == rank and (f.attempt is None or f.attempt == attempt)]
        self.collectives = 0
        self.lock = threading.Lock()


_PLAN: _Plan | None = None
_LOADED = False


def _current_attempt(env: Mapping[str, str]) -> int:
    total = 0
    for name in ("TORCHELASTIC_RESTART_COUNT", RELAUNCH_ENV):
        value = env.get(name, "0").strip()
        total += int(value) if value.isdigit() else 0
    return total


def _this_rank(env: Mapping[str, str]) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = env.get("RANK", "0").strip()
    return int(value) if value.isdigit() else 0


def _plan() -> _Plan | None:
    global _PLAN, _LOADED
    if not _LOADED:
        text = os.environ.get(FAULT_ENV, "").strip()
        if text:
            _PLAN = _Plan(parse_faults(text), _this_rank(os.environ),
                          _current_attempt(os.environ))
        _LOADED = True
    return _PLAN


def reset() -> None:
    """Forget the plan, so the next hook reads ``SCALEDL_FAULT`` again (tests)."""
    global _PLAN, _LOADED
    _PLAN, _LOADED = None, False


def at_step(step: int) -> None:
    """The trainer's hook, called before training step ``step`` (1-based)."""
    plan = _plan()
    if plan is None or not plan.armed:
        return
    for fault in [f for f in plan.armed if f.step == step]:
        plan.armed.remove(fault)
        _fire(fault)


def at_collective() -> None:
    """The collectives' hook, called at the start of every scaledl collective on this rank."""
    plan = _plan()
    if plan is None or not plan.armed:
        return
    with plan.lock:
        plan.collectives += 1
        due = [f for f in plan.armed if f.collective == plan.collectives]
        for fault in due:
            plan.armed.remove(fault)
    for fault in due:
        _fire(fault)


def _fire(fault: Fault) -> None:
    log.warning("%s (%s)", fault.describe(), FAULT_ENV)
    for handler in logging.getLogger().handlers:  # the line must be out before a SIGKILL
        with contextlib.suppress(ValueError, OSError):  # a closed stream
            handler.flush()
    if fault.kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "lose":
        if os.environ.get("TORCHELASTIC_RUN_ID") is None:
            raise InjectedFault(f"{fault.describe()}: kind:lose needs a torchelastic agent "
                                "(scaledl train or torchrun) to kill")
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind == "hang":
        threading.Event().wait()
    elif fault.kind == "raise":
        raise InjectedFault(fault.describe())
    time.sleep(fault.seconds)
