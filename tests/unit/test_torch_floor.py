"""scaledl's calls into ``torch.distributed`` exist in the oldest torch that pyproject admits.

CI runs torch 2.13, so a keyword added to ``torch.distributed`` after the floor (``group_dst``
of ``gather_object`` came in 2.6) passes CI and breaks every user on an older release. The
floor's public API, names and parameter names, is recorded in ``torch_floor_api.json`` by this
file run as a script under that release::

    python -m venv /tmp/floor && /tmp/floor/bin/pip install torch==2.4.1
    /tmp/floor/bin/python tests/unit/test_torch_floor.py > tests/unit/torch_floor_api.json

and every ``dist.NAME(...)`` in ``src/scaledl`` is checked against it: the name exists and
every keyword it passes is a parameter there. (The elastic launcher's options are filtered at
run time instead: ``scaledl.cli.launch.supported_options``.)
"""
from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FLOOR_FILE = Path(__file__).with_name("torch_floor_api.json")


def _floor() -> dict[str, Any]:
    return json.loads(FLOOR_FILE.read_text())


def _uses() -> list[tuple[str, int, str, list[str]]]:
    """Every ``dist.NAME`` in the package: (file, line, NAME, keywords of the call or [])."""
    uses = []
    for path in sorted((ROOT / "src" / "scaledl").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        called: dict[int, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                called[id(node.func)] = [k.arg for k in node.keywords if k.arg is not None]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "dist"):
                where = str(path.relative_to(ROOT))
                uses.append((where, node.lineno, node.attr, called.get(id(node), [])))
    return uses


def test_the_floor_is_the_one_pyproject_declares() -> None:
    bound = re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert bound is not None, "pyproject.toml declares no torch>= bound"
    recorded = _floor()["torch"]
    assert recorded.split(".")[:2] == bound.group(1).split(".")[:2], (
        f"torch_floor_api.json records torch {recorded}; pyproject admits torch>={bound.group(1)}:"
        " record the floor again (this file's docstring says how)")


def test_the_package_uses_torch_distributed() -> None:
    assert len(_uses()) > 100  # the scan finds what it checks


def test_every_name_exists_in_the_floor() -> None:
    api = _floor()["distributed"]
    missing = [f"{f}:{line} dist.{name}" for f, line, name, _ in _uses() if name not in api]
    assert not missing, f"not in torch {_floor()['torch']}: {missing}"


def test_every_keyword_exists_in_the_floor() -> None:
    api = _floor()["distributed"]
    wrong = []
    for where, line, name, keywords in _uses():
        params = api.get(name)
        if params is None or "**" in params:
            continue
        wrong += [f"{where}:{line} dist.{name}({kw}=...)" for kw in keywords if kw not in params]
    assert not wrong, f"keywords torch {_floor()['torch']} does not take: {wrong}"


def test_the_check_catches_a_keyword_added_after_the_floor() -> None:
    params = _floor()["distributed"]["gather_object"]
    assert "dst" in params and "group_dst" not in params


def _parameters(obj: Any) -> list[str] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    return [("**" if p.kind is p.VAR_KEYWORD else p.name) for p in signature.parameters.values()]


def _record() -> dict[str, Any]:
    """The running torch's public ``torch.distributed``: name -> parameter names (None where
    not callable or not inspectable; ``"**"`` for a ``**kwargs``)."""
    import torch
    import torch.distributed as dist

    api = {name: (_parameters(getattr(dist, name)) if callable(getattr(dist, name)) else None)
           for name in dir(dist) if not name.startswith("__")}
    return {"torch": torch.__version__.split("+")[0], "distributed": api}


if __name__ == "__main__":
    json.dump(_record(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
