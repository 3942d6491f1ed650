"""Checks of the fields of scaledl's JSON files (the simulator's profiles, the benchmark files),
shared by their readers.

:func:`shown` is how a user's value appears in an error: its text cut short to fit one line.
The predicates (:func:`is_number`, :func:`is_whole`, :func:`is_duration`, :func:`is_object`)
say what a kind of field is; the checks (:func:`number`, :func:`integer`, :func:`json_list`,
:func:`string`, :func:`json_object`) return the field or raise ``ValueError`` as
``<what> <value> must be ...``, ``what`` naming the field (a reader adds where it is and how to
fix the file).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, TypeGuard

__all__ = ["SHOWN_CHARS", "shown", "is_number", "is_whole", "is_duration", "is_object",
           "number", "integer", "json_list", "string", "json_object", "refuse_unknown"]

SHOWN_CHARS = 40
"""The most characters :func:`shown` gives."""


def shown(value: object, text: Callable[[Any], str] = json.dumps) -> str:
    """``text(value)`` (its JSON text unless told; ``repr`` for Python's), cut short to
    :data:`SHOWN_CHARS`; a value ``text`` cannot write (nested too deeply, not JSON, an
    integer of too many digits) is shown by its type."""
    try:
        whole = text(value)
    except (ValueError, TypeError, RecursionError, OverflowError):
        whole = f"<{type(value).__name__}>"
    return whole if len(whole) <= SHOWN_CHARS else whole[:SHOWN_CHARS - 3] + "..."


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number: an integer or a float, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value: object) -> TypeGuard[int]:
    """A JSON integer, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_duration(value: object) -> bool:
    """A JSON number that is finite and > 0."""
    if not is_number(value):
        return False
    seconds = _as_float(value)
    return math.isfinite(seconds) and seconds > 0


def is_object(value: object) -> TypeGuard[dict[str, Any]]:
    """A JSON object."""
    return isinstance(value, dict)


def _as_float(value: int | float) -> float:
    """``value`` as a float; infinity for an integer beyond any float."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def number(value: Any, what: str) -> float:
    """``value``, a JSON number that is finite and >= 0, as a float."""
    if not is_number(value):
        raise ValueError(f"{what} {shown(value)} must be a number")
    result = _as_float(value)
    if not (math.isfinite(result) and result >= 0):
        raise ValueError(f"{what} {shown(value)} must be a finite number >= 0")
    return result


def integer(value: Any, what: str, minimum: int = 0) -> int:
    """``value``, a JSON integer >= ``minimum``."""
    if not is_whole(value) or value < minimum:
        raise ValueError(f"{what} {shown(value)} must be an integer >= {minimum}")
    return value


def json_list(value: Any, what: str, count: int | None = None) -> list[Any]:
    """``value``, a JSON list (of ``count`` items when given)."""
    if not isinstance(value, list) or (count is not None and len(value) != count):
        size = f" of {count}" if count is not None else ""
        raise ValueError(f"{what} must be a list{size}")
    return value


def string(value: Any, what: str) -> str:
    """``value``, a JSON string."""
    if not isinstance(value, str):
        raise ValueError(f"{what} {shown(value)} must be a string")
    return value


def json_object(value: Any, what: str) -> dict[str, Any]:
    """``value``, a JSON object (a copy)."""
    if not is_object(value):
        raise ValueError(f"{what} {shown(value)} must be an object")
    return dict(value)


def refuse_unknown(record: dict[str, Any], known: set[str], where: str) -> None:
    """Refuse a field of a record (JSON object or TOML table) that its schema does not have: a
    misspelt one would be silently ignored.  ``where`` starts the message."""
    unknown = sorted(set(record) - known)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; use one of "
                         f"{', '.join(sorted(known))}")
