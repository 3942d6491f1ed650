"""How a strategy takes part in ``scaledl bench algorithms``, You et al.'s comparison of methods.

A strategy that sets ``Strategy.comparison`` to a :class:`MethodRow` is one row of the
comparison (:mod:`scaledl.bench.methods` reads the rows from the catalogue); one without a row
is not compared.  Data only: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MethodRow"]


@dataclass(frozen=True)
class MethodRow:
    """The options that make a strategy the paper's method, and its place in the table."""

    row: int
    """Position in the table (rows sort by it; the package's use multiples of 10)."""
    label: str
    """Name in tables and plots (You et al.'s)."""
    momentum: bool = False
    """Whether the method uses momentum (the bench's ``momentum``), else plain SGD steps."""
    tau: int | None = None
    """Local steps between exchanges (periodic methods); ``None`` for the others."""
    counterpart: str | None = None
    """The SGD method this EASGD variant is compared with (You et al.'s pairs)."""
    options: tuple[tuple[str, str], ...] = ()
    """Further strategy options of the method, as ``(option, value)`` pairs (the
    ``scaledl train`` flag ``--option value``), e.g. ``(("outer_dtype", "bfloat16"),)``."""
