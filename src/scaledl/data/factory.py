"""A user's own code named on the command line: ``package.module:factory``.

``scaledl train --model mypkg.nets:make_net`` and ``--dataset mypkg.data:load`` name a callable
the way ``uvicorn`` and ``gunicorn`` name an application: a module path, a colon, and an
attribute (dotted for a nested one: ``mod:Class.build``).  The directory the command runs in is
searched first, as ``python script.py`` searches the script's, so a ``nets.py`` beside the run
imports as ``nets``; every worker imports it the same way.  Every way of getting it wrong (the
form, a module that does not import, a missing attribute, something not callable) is one
sentence naming the value and the fix, raised before any worker starts.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from scaledl.backend_errors import first_line as backend_first_line

__all__ = ["is_factory_spec", "load_factory", "call_factory", "first_line"]


def is_factory_spec(name: str) -> bool:
    """Whether ``name`` has the ``module:attribute`` form (a module path before the colon)."""
    module, colon, attribute = name.partition(":")
    return bool(colon) and all(part.isidentifier()
                               for part in (*module.split("."), *attribute.split(".")))


def first_line(error: BaseException) -> str:
    """``Type: first line of the message`` (an error from user code fits one line; a backend
    error the user's code let through loses Gloo's decorations, as everywhere in scaledl)."""
    if not str(error).strip():
        return type(error).__name__
    return f"{type(error).__name__}: {backend_first_line(error)}"


def load_factory(spec: str, what: str) -> Callable[..., Any]:
    """The callable ``spec`` (``package.module:factory``) names; ``what`` says what it builds
    (``"model"``, ``"dataset"``) in the errors."""
    module_name, _, attribute = spec.partition(":")
    if not is_factory_spec(spec):
        raise ValueError(f"{what} {spec!r} is not of the form package.module:factory; name a "
                         f"module and the callable in it that returns the {what}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)  # a module beside the run imports as with `python script.py`
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{what} {spec!r}: module {module_name!r} does not import "
                         f"({first_line(error)}); run from the directory that holds it or put "
                         "it on PYTHONPATH") from error
    except Exception as error:  # noqa: BLE001 - any error of the user's module, in one line
        raise ValueError(f"{what} {spec!r}: importing module {module_name!r} raised "
                         f"{first_line(error)}; fix the module") from error
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{what} {spec!r}: module {module_name!r} has no attribute "
                             f"{attribute!r}; name a callable it defines")
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"{what} {spec!r} is a {type(found).__name__}, not callable; name a "
                         f"function or class that returns the {what}")
    return found  # type: ignore[no-any-return]  # callable() narrowed it


def call_factory(factory: Callable[..., Any], spec: str, what: str, **offered: Any) -> Any:
    """Call ``factory`` with those of the ``offered`` keywords its signature takes (all of them
    when it takes ``**kwargs``); whatever it raises becomes one line naming ``spec``."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: offer nothing
        parameters = []  # type: ignore[assignment]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        taken = dict(offered)
    else:
        names = {p.name for p in parameters if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                            inspect.Parameter.POSITIONAL_OR_KEYWORD)}
        taken = {key: value for key, value in offered.items() if key in names}
    try:
        return factory(**taken)
    except Exception as error:  # noqa: BLE001 - the user's factory failed: say so in one line
        raise ValueError(f"{what} factory {spec!r} raised {first_line(error)}; fix the factory "
                         f"(it was called with {', '.join(taken) or 'no arguments'})") from error
