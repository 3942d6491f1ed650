"""Strategy: one interface for every distributed training algorithm.

Wrap a model and its optimizer; train with ``strategy.model`` and, after ``loss.backward()``,
call ``strategy.step()``.  ``state_dict()`` / ``load_state_dict()`` hold everything needed to
resume (model, optimizer, and the strategy's own state); ``stats`` reports communication.
Synchronous strategies are bitwise deterministic for a fixed world size and seed.

Roles.  Every rank builds the same strategy.  Most strategies make every rank a worker.  A
parameter-server strategy may set aside dedicated server ranks (the *last* ``servers`` ranks, so
rank 0 is always a worker): on those, ``is_worker`` is False and the training loop calls
``serve()``, which returns once every worker has called ``finish()``.  Workers shard the data by
``worker_rank`` / ``num_workers`` and evaluate ``evaluation_module()`` (for elastic averaging,
the center variable) together over ``worker_group``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from scaledl.strategies.comparison import MethodRow
from scaledl.strategies.options import StrategyOptions
from scaledl.sync.stats import SyncStats

__all__ = ["Strategy", "COLLECTIVE_KEYWORDS", "TIMINGS"]


COLLECTIVE_KEYWORDS: tuple[str, ...] = ("algorithm", "topology", "timeline")
"""Constructor keywords of a strategy that runs scaledl's collectives."""

TIMINGS: tuple[str, ...] = ("bucketed", "per-layer", "periodic", "round-robin")
"""The simulator's models of one iteration (:mod:`scaledl.sim.iteration`): bucketed allreduce
during backward, per-layer reduce + broadcast to a root, a packed-model collective exchange
every ``tau`` steps, a master serving the workers one at a time every ``tau`` steps."""


class Strategy(ABC):
    """A distributed training algorithm around one model and one optimizer.

    A subclass that sets ``name`` in its own body is a strategy of the catalogue
    (:mod:`scaledl.strategies.catalogue`): its name, traits, options, the constructor keywords
    the trainer passes, its simulator model and its row in the bench's comparison are declared
    here, on the class, and nowhere else.
    """

    name: str = "strategy"
    collectives: ClassVar[str] = "any"
    """Which collective algorithms apply: ``any`` allreduce algorithm, ``rooted`` ones (reduce
    and broadcast), or ``none`` (point to point: a server, a round-robin master)."""
    periodic: ClassVar[bool] = False
    """Communicates every ``tau`` local steps (takes ``tau``)."""
    elastic: ClassVar[bool] = False
    """Pulls the workers toward a center variable (takes ``alpha``, or ``rho``)."""
    server: ClassVar[bool] = False
    """Served by a parameter server (dedicated ranks, or threads beside rank 0)."""
    applies_momentum: ClassVar[bool] = True
    """Its update applies momentum (the optimizer's, or its own of that value); False where it
    takes none, so that a ``momentum`` the user sets is refused rather than ignored."""
    keywords: ClassVar[tuple[str, ...]] = COLLECTIVE_KEYWORDS
    """The run's values the trainer passes to the constructor, besides the module, the
    optimizer and the keywords of :attr:`options` (``algorithm``, ``topology``, ``timeline``,
    ``bucket_mb``, ``momentum``, ``timeout_s``, ``idle_timeout_s``)."""
    options: ClassVar[type[StrategyOptions]] = StrategyOptions
    """The strategy's own ``[parallel]`` options (:mod:`scaledl.strategies.options`)."""
    timing: ClassVar[str | None] = None
    """The simulator's model of its iteration, one of :data:`TIMINGS` (``None``: not
    simulated)."""
    comparison: ClassVar[MethodRow | None] = None
    """Its row in ``scaledl bench algorithms`` (``None``: not compared)."""

    @classmethod
    def collective_kind(cls, easgd_form: str = "tree") -> str:
        """:attr:`collectives` for these options (Sync EASGD's depends on its form)."""
        return cls.collectives

    def __init__(self, module: nn.Module, optimizer: Optimizer) -> None:
        self.module = module
        self.optimizer = optimizer

    @property
    @abstractmethod
    def model(self) -> nn.Module:
        """The module to call for forward passes (it may wrap ``module``)."""

    @abstractmethod
    def step(self) -> None:
        """Apply this step's update, after ``loss.backward()``."""

    @property
    @abstractmethod
    def stats(self) -> SyncStats:
        """Communication accounting since the last ``stats.reset()``."""

    # -- roles (see the module docstring) --------------------------------------------------------
    @property
    def is_worker(self) -> bool:
        """Whether this rank trains (False on a dedicated parameter-server rank)."""
        return True

    @property
    def worker_rank(self) -> int:
        """This worker's index among the workers, ``0 .. num_workers - 1``."""
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def num_workers(self) -> int:
        """How many ranks train (the world size minus dedicated server ranks)."""
        return dist.get_world_size() if dist.is_initialized() else 1

    @property
    def worker_group(self) -> dist.ProcessGroup | None:
        """The process group of the workers (``None``: the default group, every rank)."""
        return None

    def serve(self) -> None:
        """On a server rank: serve the workers until all of them have called :meth:`finish`."""
        raise RuntimeError(f"strategy {self.name!r} has no server ranks; every rank is a worker")

    def finish(self) -> None:
        """Called once by each worker after its last step: finish pending communication and
        (asynchronous strategies) tell the server this worker is done."""
        self.synchronize()

    def evaluation_module(self) -> nn.Module:
        """The parameters to evaluate: the trained module, or for elastic averaging the center
        variable.  It may communicate (a pull from a server), so call it on every worker."""
        return self.module

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of the wrapped module."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def synchronize(self) -> None:
        """Finish pending communication, so that ``module`` holds the current parameters."""

    def close(self) -> None:
        """Release what the strategy owns (server threads, process groups); called once by every
        rank at the end of training.  The strategy is unusable afterwards."""

    def prepare_checkpoint(self) -> None:
        """A collective of every worker, called before rank 0 takes :meth:`state_dict`: a
        strategy whose workers hold different parameters (the EASGD family, local SGD) gathers
        them to rank 0 here so that a resume restores each worker exactly."""

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer and strategy state."""
        self.synchronize()
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "strategy": {"name": self.name},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        saved = state.get("strategy", {}).get("name", self.name)
        if saved != self.name:
            raise ValueError(
                f"checkpoint was written by strategy {saved!r}, not {self.name!r}; "
                f"resume with --strategy {saved}"
            )
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
