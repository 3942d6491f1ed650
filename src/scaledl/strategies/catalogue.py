"""The strategy catalogue: every training strategy, found where it is declared.

A strategy is a :class:`~scaledl.strategies.base.Strategy` subclass that sets ``name`` in its own
class body; the same body declares its traits (which collectives apply, periodic, elastic,
served by a parameter server), its options dataclass (:mod:`scaledl.strategies.options`), the
run values the trainer passes, the simulator's model of its iteration and its row in the
bench's comparison.  The catalogue imports every module of this package and collects those
classes, so adding a strategy is one new module here (plus its tests): the configuration check,
``scaledl train``'s choices and options, the option routing, ``scaledl bench algorithms`` and
``scaledl simulate`` all read this catalogue.  A class defined elsewhere (an experiment, a
test) joins it as soon as its module is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import sys

from scaledl.strategies.base import Strategy

__all__ = ["strategies", "strategy_class", "names_with", "option_fields", "option_takers",
           "TRAITS"]

TRAITS = ("periodic", "elastic", "server")
"""The boolean traits a strategy declares."""

_imported = False


def _import_package() -> None:
    global _imported
    if _imported:
        return
    package = importlib.import_module("scaledl.strategies")
    for module in pkgutil.walk_packages(package.__path__, "scaledl.strategies."):
        importlib.import_module(module.name)
    _imported = True


def _subclasses(direct: list[type[Strategy]]) -> list[type[Strategy]]:
    """``direct`` and every subclass of theirs."""
    found = []
    for sub in direct:
        found += [sub, *_subclasses(sub.__subclasses__())]
    return found


def _order(cls: type[Strategy]) -> tuple[bool, str, int]:
    """Synchronous strategies first, then by module and by position in it: the class's place
    among its module's names (definition order, without parsing the source, which cost every
    training process a few tenths of a second), else its source line after all of those (a
    class made inside a function), else last (made at run time by ``type(...)``)."""
    names = list(vars(sys.modules[cls.__module__])) if cls.__module__ in sys.modules else []
    if cls.__qualname__ in names and getattr(sys.modules[cls.__module__], cls.__qualname__) is cls:
        return (cls.server, cls.__module__, names.index(cls.__qualname__))
    try:
        line = len(names) + inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        line = 1 << 30
    return (cls.server, cls.__module__, line)


def strategies() -> dict[str, type[Strategy]]:
    """Every strategy by name: the synchronous ones first, each group in module order."""
    _import_package()
    found = tuple(_subclasses(Strategy.__subclasses__()))
    key = tuple((cls, vars(cls).get("name")) for cls in found)
    cached = _CACHE.get(key)
    if cached is not None:
        return dict(cached)
    catalogue: dict[str, type[Strategy]] = {}
    for cls in sorted(found, key=_order):
        if "name" not in vars(cls):
            continue  # a base class (periodic, elastic, parameter server)
        other = catalogue.get(cls.name)
        if other is not None and other is not cls:
            raise ValueError(f"strategies {other.__qualname__} and {cls.__qualname__} are both "
                             f"named {cls.name!r}; give one another name")
        catalogue[cls.name] = cls
    _CACHE.clear()
    _CACHE[key] = catalogue
    return dict(catalogue)


_CACHE: dict[tuple[tuple[type[Strategy], object], ...], dict[str, type[Strategy]]] = {}
"""The last catalogue, by the classes and names it was built from (a new one rebuilds it)."""


def strategy_class(name: str) -> type[Strategy]:
    """The strategy called ``name``; a one-line error listing the known ones otherwise."""
    catalogue = strategies()
    if name not in catalogue:
        raise ValueError(f"strategy {name!r} is unknown; choose one of {', '.join(catalogue)}")
    return catalogue[name]


def names_with(trait: str) -> tuple[str, ...]:
    """Names of the strategies that have ``trait`` (one of :data:`TRAITS`)."""
    if trait not in TRAITS:
        raise ValueError(f"unknown trait {trait!r}; one of {', '.join(TRAITS)}")
    return tuple(name for name, cls in strategies().items() if getattr(cls, trait))


def option_fields() -> dict[str, dataclasses.Field[object]]:
    """Every strategy option by name (``tau``, ``alpha``, ...), in catalogue order: the fields of
    the strategies' options dataclasses, each once."""
    fields: dict[str, dataclasses.Field[object]] = {}
    for cls in strategies().values():
        for field in dataclasses.fields(cls.options):
            fields.setdefault(field.name, field)
    return fields


def option_takers(option: str) -> tuple[str, ...]:
    """Names of the strategies whose options include ``option``."""
    return tuple(name for name, cls in strategies().items() if option in cls.options.names())
