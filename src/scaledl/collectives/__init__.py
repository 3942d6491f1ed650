"""Collective algorithms as plans (schedules of steps) plus one executor.

``available("allreduce")`` lists the algorithm names; :mod:`scaledl.collectives.api` holds the
public in-place collectives re-exported by :mod:`scaledl`.
"""

from scaledl.collectives.api import (
    allgather, allreduce, broadcast, explain, reduce, reduce_scatter, resolve_topology,
)
from scaledl.collectives.auto import choose
from scaledl.collectives.cost import CostModel, LinkCost
from scaledl.collectives.communicator import CollectiveHandle
from scaledl.collectives.ops import ReduceOp
from scaledl.collectives.registry import ALGORITHMS, available, lookup, plan
from scaledl.collectives.schedule import Action, Collective, Round, Schedule, Transfer

__all__ = [
    "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "explain",
    "resolve_topology",
    "available", "lookup", "plan", "ALGORITHMS", "CostModel", "LinkCost", "choose",
    "CollectiveHandle", "ReduceOp", "Action", "Collective", "Round", "Schedule", "Transfer",
]
