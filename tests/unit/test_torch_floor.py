"""The oldest torch that pyproject admits: scaledl refuses older ones, and its calls into
``torch.distributed`` exist in that one.

CI runs torch 2.13, so a keyword added to ``torch.distributed`` after the floor (``barrier``'s
``timeout``, say) passes CI and breaks every user on an older release: ``gather_object``'s
``group_dst`` (torch 2.6) broke checkpoints of the periodic strategies under the floor of the
time, 2.4. The
floor's public API, names and parameter names, is recorded in ``torch_floor_api.json`` by this
file run as a script under that release::

    python -m venv /tmp/floor && /tmp/floor/bin/pip install torch==2.8.0
    /tmp/floor/bin/python tests/unit/test_torch_floor.py > tests/unit/torch_floor_api.json

and every ``dist.NAME(...)`` in ``src/scaledl`` is checked against it: the name exists and
every keyword it passes is a parameter there. (The elastic launcher's options are filtered at
run time instead: ``scaledl.launch.policy.supported_options``.)
"""
from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scaledl.torch_version import MIN_TORCH, check_torch, release

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


def _pyproject_bound() -> str:
    bound = re.search(r'"torch>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert bound is not None, "pyproject.toml declares no torch>= bound"
    return bound.group(1)


def test_scaledl_checks_the_bound_pyproject_declares() -> None:
    assert release(MIN_TORCH) == release(_pyproject_bound())


@pytest.mark.parametrize("version", ["2.4.1", "2.7.1+cu126", "1.13.0"])
def test_an_older_torch_is_refused_in_one_sentence(version: str) -> None:
    with pytest.raises(ImportError, match=rf"scaledl needs torch >= {MIN_TORCH}, and this "
                       rf"environment has torch {re.escape(version)}: upgrade it"):
        check_torch(version)


@pytest.mark.parametrize("version", [MIN_TORCH + ".0", "2.13.0+cpu", "2.10.0a0+git1234", "3.0"])
def test_the_floor_and_newer_releases_pass(version: str) -> None:
    check_torch(version)


def test_a_version_that_is_not_major_minor_is_an_error() -> None:
    with pytest.raises(ValueError, match="torch version 'nightly' is not major.minor"):
        release("nightly")


def test_import_scaledl_refuses_an_older_torch() -> None:
    code = "import torch; torch.__version__ = '2.4.1'; import scaledl"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode != 0
    assert f"ImportError: scaledl needs torch >= {MIN_TORCH}" in done.stderr


def test_the_floor_is_the_one_pyproject_declares() -> None:
    bound = _pyproject_bound()
    recorded = _floor()["torch"]
    assert release(recorded) == release(bound), (
        f"torch_floor_api.json records torch {recorded}; pyproject admits torch>={bound}:"
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
    params = _floor()["distributed"]["barrier"]
    assert "group" in params and "timeout" not in params


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
