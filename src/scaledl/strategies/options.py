"""A strategy's own options: the ``[parallel]`` settings that only some strategies take.

Each strategy class names its options dataclass (``Strategy.options``); this module holds the
blocks they are built from, so a family's option is declared, documented and checked once:

* :class:`StrategyOptions`: none (allreduce, reduce-broadcast);
* :class:`PeriodicOptions`: ``tau``, the local steps between exchanges;
* :class:`ElasticOptions`: ``tau`` and the elastic moving rate ``alpha`` (or ``rho``);
* :class:`ServerOptions`: ``servers``, the dedicated parameter-server ranks;
* :class:`ServerElasticOptions`: both, for the asynchronous EASGD family;
* DiLoCo's options extend :class:`PeriodicOptions` in :mod:`scaledl.strategies.diloco`.

A field's ``metadata`` gives its ``scaledl train`` flag (type and help); a class checks its own
values in ``_check`` (one-line errors naming the value and the fix), checks that need the job
(the ranks, the learning rate) in :meth:`StrategyOptions.check_job`, checks that need the model
in :meth:`StrategyOptions.check_model`, and turns itself into the
strategy's constructor keywords in :meth:`StrategyOptions.keywords`.  No torch here: the
configuration check and the CLI read these without building anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the configuration check imports no torch
    from torch import nn

__all__ = [
    "StrategyOptions", "PeriodicOptions", "ElasticOptions", "ServerOptions",
    "ServerElasticOptions", "option",
]


def option(kind: type, help_text: str, default: Any = None) -> Any:
    """A strategy option field: its default, and the type and help of its ``scaledl train``
    flag (``metadata["type"]``, ``metadata["help"]``)."""
    return field(default=default, metadata={"type": kind, "help": help_text})


@dataclass(frozen=True)
class StrategyOptions:
    """Options of a strategy that takes none of its own; the base of every options class."""

    def __post_init__(self) -> None:
        for klass in reversed(type(self).__mro__):  # each block checks its own fields once
            check = vars(klass).get("_check")
            if check is not None:
                check(self)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, as ``[parallel]`` keys and ``scaledl train`` flags."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def workers(self, ranks: int) -> int:
        """The ranks that train among ``ranks`` (all of them unless some serve)."""
        return ranks

    def check_job(self, ranks: int, lr: float) -> None:
        """Raise ``ValueError`` (one line) when these options cannot run on ``ranks`` ranks
        with learning rate ``lr``; called before any worker starts."""

    def check_model(self, module: nn.Module) -> None:
        """Raise ``ValueError`` (one line) when these options cannot apply to ``module`` (built
        on the meta device, before any worker starts), e.g. more fragments than tensors."""

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        """The strategy's constructor keywords for these options on ``ranks`` ranks."""
        return {}


@dataclass(frozen=True)
class PeriodicOptions(StrategyOptions):
    """Options of a strategy that exchanges every ``tau`` local steps."""

    tau: int | None = option(int, "local steps between exchanges (EASGD family, local-sgd)")
    """Local steps between exchanges; ``None``: 1, every step."""

    def _check(self) -> None:
        if self.tau is not None and self.tau < 1:
            raise ValueError(f"tau {self.tau} must be at least 1 (local steps between exchanges)")

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        return {**super().keywords(ranks, lr), "tau": self.tau or 1}


@dataclass(frozen=True)
class ElasticOptions(PeriodicOptions):
    """Options of a strategy that pulls its workers toward a center every ``tau`` steps."""

    alpha: float | None = option(float, "elastic moving rate in (0, 1) (EASGD family; "
                                 "default 0.9 / workers)")
    """Elastic moving rate ``eta * rho`` in (0, 1); ``None``: ``0.9 / workers`` (Zhang et
    al.'s ``beta = p * alpha = 0.9``), or ``lr * rho`` when ``rho`` is given."""
    rho: float | None = option(float, "elastic strength; alpha = lr * rho (instead of --alpha)")
    """Elastic strength; ``alpha = lr * rho``.  Give ``alpha`` or ``rho``, not both."""

    def _check(self) -> None:
        if self.alpha is not None and not 0 < self.alpha < 1:
            raise ValueError(f"alpha {self.alpha} must be in (0, 1), e.g. 0.9 / workers")
        if self.rho is not None and not self.rho > 0:
            raise ValueError(f"rho {self.rho} must be positive (alpha = lr * rho)")
        if self.alpha is not None and self.rho is not None:
            raise ValueError(f"alpha {self.alpha} and rho {self.rho} were both given; give one "
                             "(alpha = lr * rho)")

    def moving_rate(self, workers: int, lr: float) -> float:
        """The elastic moving rate: ``alpha``, else ``lr * rho``, else ``0.9 / workers``."""
        if self.alpha is not None:
            return self.alpha
        if self.rho is not None:
            alpha = lr * self.rho
            if not 0 < alpha < 1:
                raise ValueError(f"alpha = lr * rho = {lr} * {self.rho} = {alpha:g} must be in "
                                 "(0, 1); lower --rho or give --alpha")
            return alpha
        return 0.9 / max(1, workers)

    def check_job(self, ranks: int, lr: float) -> None:
        super().check_job(ranks, lr)
        self.moving_rate(self.workers(ranks), lr)

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        return {**super().keywords(ranks, lr),
                "alpha": self.moving_rate(self.workers(ranks), lr)}


@dataclass(frozen=True)
class ServerOptions(StrategyOptions):
    """Options of a strategy served by a parameter server."""

    servers: int = option(int, "dedicated parameter-server ranks, taken from --workers "
                          "(async strategies; default 0: a server thread beside rank 0)",
                          default=0)
    """Dedicated parameter-server ranks (the last ones); 0 runs the server as a thread beside
    rank 0's worker."""

    def _check(self) -> None:
        if self.servers < 0:
            raise ValueError(f"servers {self.servers} must be >= 0 (0: a server thread beside "
                             "rank 0)")

    def workers(self, ranks: int) -> int:
        """The ranks less the dedicated servers."""
        return ranks - self.servers

    def check_job(self, ranks: int, lr: float) -> None:
        if self.servers >= ranks:
            raise ValueError(f"servers {self.servers} leaves no worker among {ranks} ranks; give "
                             f"--workers {self.servers + 1} or more, or fewer --servers")
        super().check_job(ranks, lr)

    def keywords(self, ranks: int, lr: float) -> dict[str, Any]:
        return {**super().keywords(ranks, lr), "servers": self.servers}


@dataclass(frozen=True)
class ServerElasticOptions(ServerOptions, ElasticOptions):
    """Options of the asynchronous elastic strategies: servers, ``tau`` and the moving rate."""
