"""The ``[parallel]`` section of a training configuration: workers, strategy and communication.

Which strategy takes which option, and what a valid value is, is the strategy's own
declaration (its options dataclass, :mod:`scaledl.strategies.options`, found through
:mod:`scaledl.strategies.catalogue`); this module only holds the values a TOML file or the
command line gives, one field per option name."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from scaledl.bootstrap import DEFAULT_TIMEOUT_S
from scaledl.strategies.catalogue import option_fields, option_takers, strategy_class
from scaledl.strategies.options import StrategyOptions
from scaledl.sync.compression import resolve_compression
from scaledl.topology import parse_axes

__all__ = ["ParallelConfig", "check_types", "MIN_TIMEOUT_S"]

MIN_TIMEOUT_S = 1.0
"""The shortest ``timeout_s``: below it Gloo's rendezvous and connections fail inside torch
(a C++ stack dump at 0.01 s) before a worker could be late."""


@dataclass(frozen=True)
class ParallelConfig:
    """How many workers train together and how they communicate."""

    workers: int | None = None
    """Worker processes; ``None`` means one per CPU core (or the launcher's count)."""
    strategy: str = "allreduce"
    """Training strategy, a name of :mod:`scaledl.strategies.catalogue`."""
    algorithm: str = "auto"
    """Collective algorithm; the trainer checks it against ``scaledl.collectives.available``."""
    topology: str | None = None
    """Network layout innermost axis first, e.g. ``"2x2"``; ``None`` detects or assumes flat."""
    bucket_mb: float = 25.0
    """Gradient bucket size in MiB: a full bucket starts its collective during backward."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Seconds any blocking distributed call may take before the run fails naming the rank;
    the library's own default (``scaledl.init()``, ``scaledl bench``), so one number holds
    everywhere."""
    compression: str = "none"
    """How the gradient buckets travel (``DataParallel(compression=...)``): ``none``, ``bf16``,
    ``fp16``, ``powersgd`` or ``powersgd:RANK`` (:mod:`scaledl.sync.compression`)."""
    # The strategies' options: their dataclasses (scaledl.strategies.options, SyncEASGDOptions)
    # declare, document and check them; a strategy with an option of a new name needs its
    # field here too.
    alpha: float | None = None
    rho: float | None = None
    tau: int | None = None
    servers: int = 0
    easgd_form: str | None = None
    outer_lr: float | None = None
    outer_momentum: float | None = None
    outer_dtype: str | None = None
    fragments: int | None = None
    overlap_steps: int | None = None
    sync_warmup_steps: int | None = None
    sync_warmup_lr_scale: float | None = None

    def __post_init__(self) -> None:
        check_types(self)
        self._check_basics()
        self._check_options()

    def _given_options(self) -> dict[str, Any]:
        """The strategy options set to something other than their default."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        given = {}
        for name in option_fields():
            if name not in defaults:
                raise ValueError(f"strategy option {name!r} has no [parallel] field; add it to "
                                 "ParallelConfig")
            if getattr(self, name) != defaults[name]:
                given[name] = getattr(self, name)
        return given

    def _check_options(self) -> None:
        """Each given option's own check (the options dataclass of a strategy that takes it),
        then: an option the chosen strategy does not use is a mistake, not something to
        ignore."""
        given = self._given_options()
        checked: set[str] = set()
        for name in given:
            if name in checked:
                continue
            owner = strategy_class(option_takers(name)[0]).options
            mine = {key: value for key, value in given.items() if key in owner.names()}
            owner(**mine)
            checked |= set(mine)
        taken = strategy_class(self.strategy).options.names()
        for name, value in given.items():
            if name not in taken:
                raise ValueError(f"{name} {value!r} does not apply to strategy "
                                 f"{self.strategy!r}, only to {', '.join(option_takers(name))}; "
                                 "drop it")
        self.strategy_options()  # the chosen strategy's own checks

    def strategy_options(self) -> StrategyOptions:
        """The chosen strategy's options dataclass, from this section's values."""
        cls = strategy_class(self.strategy).options
        return cls(**{name: getattr(self, name) for name in cls.names()})

    def _check_basics(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(
                f"workers {self.workers} must be at least 1, or unset for one per core"
            )
        strategy_class(self.strategy)  # a one-line error naming the known ones
        if not self.algorithm:
            raise ValueError(
                "algorithm '' is empty; use 'auto' or an algorithm name such as 'ring'"
            )
        if self.topology is not None:
            parse_axes(self.topology)
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb {self.bucket_mb} must be positive, e.g. 25")
        resolve_compression(self.compression)  # the compression's own one-line error
        if not self.timeout_s >= MIN_TIMEOUT_S:
            raise ValueError(f"timeout_s {self.timeout_s} is too short for workers to connect "
                             f"and a collective to finish; give at least {MIN_TIMEOUT_S:g} s "
                             f"(default {DEFAULT_TIMEOUT_S:g})")

def check_types(instance: Any) -> None:
    """Raise ``ValueError`` when a field holds a value of the wrong type (TOML typos); accept
    an int where a float is expected and store it as a float."""
    hints = typing.get_type_hints(type(instance))
    section = type(instance).__name__.removesuffix("Config").lower()  # its TOML table
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        allowed = typing.get_args(hints[f.name]) or (hints[f.name],)
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(instance, f.name, float(value))
            continue
        if any(type(value) is kind for kind in allowed):
            continue
        names = " or ".join(_TYPE_WORDS.get(kind, getattr(kind, "__name__", str(kind)))
                            for kind in allowed)
        raise ValueError(f"[{section}] {f.name} = {value!r} must be {names}")


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               type(None): "left out"}
"""How a TOML user reads each field type."""

