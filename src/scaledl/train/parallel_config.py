"""The ``[parallel]`` section of a training configuration: workers, strategy and communication.

Which strategy takes which option is the strategy's own declaration
(:mod:`scaledl.strategies.catalogue`); this module only reads it."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from scaledl.strategies.catalogue import strategies, strategy_class
from scaledl.topology import parse_axes

__all__ = [
    "ParallelConfig", "EASGD_FORMS", "check_types", "takers",
]

EASGD_FORMS: tuple[str, ...] = ("tree", "allreduce")
"""How Sync EASGD exchanges with the center: tree reduce + broadcast, or an allreduce of the
elastic differences with a replicated center."""


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
    timeout_s: float = 60.0
    """Seconds any blocking distributed call may take before the run fails naming the rank."""
    alpha: float | None = None
    """Elastic moving rate ``eta * rho`` in (0, 1); ``None``: ``0.9 / workers`` (Zhang et al.'s
    ``beta = p * alpha = 0.9``), or ``lr * rho`` when ``rho`` is given."""
    rho: float | None = None
    """Elastic strength; ``alpha = lr * rho``.  Give ``alpha`` or ``rho``, not both."""
    tau: int | None = None
    """Local steps between exchanges of the periodic strategies (EASGD family, local SGD);
    ``None``: 1, every step."""
    servers: int = 0
    """Dedicated parameter-server ranks (the last ones); 0 runs the server as a thread beside
    rank 0's worker."""
    easgd_form: str | None = None
    """Sync EASGD's exchange: ``"tree"`` (reduce + broadcast, the default) or ``"allreduce"``."""

    def __post_init__(self) -> None:
        check_types(self)
        self._check_basics()
        self._check_elastic()

    def _check_elastic(self) -> None:
        if self.alpha is not None and not 0 < self.alpha < 1:
            raise ValueError(f"alpha {self.alpha} must be in (0, 1), e.g. 0.9 / workers")
        if self.rho is not None and not self.rho > 0:
            raise ValueError(f"rho {self.rho} must be positive (alpha = lr * rho)")
        if self.alpha is not None and self.rho is not None:
            raise ValueError(f"alpha {self.alpha} and rho {self.rho} were both given; give one "
                             "(alpha = lr * rho)")
        if self.tau is not None and self.tau < 1:
            raise ValueError(f"tau {self.tau} must be at least 1 (local steps between exchanges)")
        if self.servers < 0:
            raise ValueError(f"servers {self.servers} must be >= 0 (0: a server thread beside "
                             "rank 0)")
        if self.easgd_form is not None and self.easgd_form not in EASGD_FORMS:
            raise ValueError(f"easgd_form {self.easgd_form!r} is unknown; use one of "
                             f"{', '.join(EASGD_FORMS)}")
        self._check_applies()

    def _check_applies(self) -> None:
        """An option the chosen strategy does not use is a mistake, not something to ignore."""
        for option, value, keyword in (
            ("alpha", self.alpha, "alpha"), ("rho", self.rho, "alpha"), ("tau", self.tau, "tau"),
            ("servers", self.servers or None, "servers"), ("easgd_form", self.easgd_form, "form"),
        ):
            users = takers(keyword)
            if value is not None and self.strategy not in users:
                raise ValueError(f"{option} {value!r} does not apply to strategy "
                                 f"{self.strategy!r}, only to {', '.join(users)}; drop it")

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
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s {self.timeout_s} must be positive, e.g. 60")

def check_types(instance: Any) -> None:
    """Raise ``ValueError`` when a field holds a value of the wrong type (TOML typos); accept
    an int where a float is expected and store it as a float."""
    hints = typing.get_type_hints(type(instance))
    section = type(instance).__name__
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
        names = " or ".join("None" if kind is type(None) else kind.__name__ for kind in allowed)
        raise ValueError(f"{section}.{f.name} = {value!r} must be {names}")


def takers(keyword: str) -> tuple[str, ...]:
    """The strategies whose constructor takes ``keyword`` (``alpha``: the elastic ones, ``tau``:
    the periodic ones, ``servers``: the parameter-server ones, ``form``: Sync EASGD)."""
    return tuple(name for name, cls in strategies().items() if keyword in cls.keywords)
