"""Each layer imports only the layers before it (design.md section 1).

topology -> transport -> collectives -> sync -> strategies -> train -> cli, with data and models
beside train's inputs, and bench / sim / cluster beside the stack (they may use any layer below
cli); calibration (the benchmark file and the fits) sits after collectives, below bench and sim,
which both use it; profiling (measuring a model's compute and the profile file) sits after
models, below sim.  ``scaledl/__init__.py`` is the public facade and may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scaledl.cli.main import COMMANDS
from tests.helpers_imports import modules_loaded_by

SRC = Path(__file__).resolve().parents[2] / "src" / "scaledl"

LAYERS: dict[str, float] = {
    "torch_version": -1, "files": -1, "json_fields": -1, "backend_errors": -1,
    "topology": 0, "launchers": 0.5, "signature": 0.75,
    "bootstrap": 1, "processes": 1, "faults": 1,
    "transport": 2,
    "collectives": 3,
    "calibration": 3.5,
    "sync": 4,
    "strategies": 5, "horovod": 5,
    "data": 6, "models": 6,
    "profiling": 6.5,
    "train": 7, "integrations": 7,
    "bench": 8, "sim": 8, "cluster": 8, "launch": 8,
    "cli": 9,
    "__main__": 10,  # python -m scaledl: runs the cli
}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "scaledl" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p != SRC / "__init__.py")


def test_every_module_belongs_to_a_layer() -> None:
    for path in _modules():
        top = path.relative_to(SRC).parts[0].removesuffix(".py")
        assert top in LAYERS, f"{path} is in no layer; add it to design.md and LAYERS"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_respect_layers(path: Path) -> None:
    own = path.relative_to(SRC).parts[0].removesuffix(".py")
    for module in _imports(path):
        target = _layer_of(module)
        if target is None or target == own:
            continue
        assert target in LAYERS, f"{path.name} imports unknown layer {module}"
        assert LAYERS[target] < LAYERS[own], (
            f"{path.relative_to(SRC)} (layer {own}) must not import {module} (layer {target})"
        )


P2P_CALLS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp"})
"""torch.distributed's point-to-point functions: every byte they move belongs in transport/."""

P2P_ALLOWED = ("transport/", "collectives/native.py", "bench/collectives.py")
"""The transports, the backend's own collectives, and the bench's raw point-to-point ceiling."""


def _p2p_calls(path: Path) -> list[str]:
    """``dist.<fn>`` / ``torch.distributed.<fn>`` point-to-point uses, and imports of them."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in P2P_CALLS:
            owner = ast.unparse(node.value)
            if owner in ("dist", "torch.distributed"):
                found.append(f"line {node.lineno}: {owner}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names
                      if a.name in P2P_CALLS]
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_point_to_point_only_through_transport(path: Path) -> None:
    where = path.relative_to(SRC).as_posix()
    if where.startswith(P2P_ALLOWED):
        return
    assert not _p2p_calls(path), (
        f"{where} moves bytes point to point itself ({_p2p_calls(path)}); go through transport/ "
        "(TorchTransport for schedules, DirectTransport for request/reply protocols)"
    )


def test_the_point_to_point_check_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import torch.distributed as dist\nfrom torch.distributed import irecv\n"
                      "dist.isend(t, 1)\n")
    assert len(_p2p_calls(sample)) == 2


def test_strategies_use_no_communicator_insides() -> None:
    """Strategies reach a group's transport through the communicator's API, not its fields."""
    for path in (SRC / "strategies").rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        inside = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                  and n.attr in ("transport", "channel", "submit")]
        assert not inside, f"{path.relative_to(SRC)} uses a communicator's insides at {inside}"


CONSOLE_MODULES = ("rich", "argparse")


def _console_uses(path: Path) -> list[str]:
    """Imports of console libraries and calls of print() in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [f"line {n.lineno}: print()" for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "print"]
    found += [f"imports {module}" for module in _imports(path)
              if module.split(".")[0] in CONSOLE_MODULES]
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_console_only_in_cli(path: Path) -> None:
    if path.relative_to(SRC).parts[0] == "cli":
        return
    assert not _console_uses(path), (
        f"{path.relative_to(SRC)} talks to the console ({_console_uses(path)}); return data and "
        "let a cli/ module show it"
    )


def test_the_console_check_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import argparse\nfrom rich.table import Table\nprint('x')\n")
    assert len(_console_uses(sample)) == 3


def test_the_cli_every_worker_imports_leaves_out_what_training_does_not_use() -> None:
    """``scaledl train`` runs each worker as ``python -m scaledl.cli.main``, so whatever the CLI
    imports every worker imports: SciPy (the simulator's statistics and fits), scikit-learn
    (the digits are read from its CSV) and matplotlib (rank 0 loads it for the plots) wait
    until they are used (docs/training.md, "What a short run costs before it trains")."""
    assert modules_loaded_by("import scaledl.cli.main", ("scipy", "sklearn", "matplotlib")) == []


def test_a_subcommand_loads_no_other_subcommand() -> None:
    """Every worker of ``scaledl train`` and every restart pays for what the CLI imports: the
    other four subcommands (their parsers import the bench, the simulator and the cluster) are
    a fifth of a second of each worker's start-up, so a subcommand imports only its own."""
    statements = ("import contextlib, io\nfrom scaledl.cli.main import main\n"
                  "with contextlib.redirect_stdout(io.StringIO()):\n"
                  "    try:\n        main(['train', '--help'])\n"
                  "    except SystemExit:\n        pass")
    assert modules_loaded_by(statements, tuple(COMMANDS.values())) == ["scaledl.cli.train"]


def test_an_elastic_agent_loads_no_training_code() -> None:
    """``scaledl train`` starts one elastic agent per worker (scaledl.launch.agents); each
    imports torch's agent, and only that."""
    loaded = modules_loaded_by("import scaledl.launch.agent_main",
                               ("scaledl.train", "scaledl.strategies", "scaledl.models"))
    assert loaded == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of scaledl that ``path`` imports when it runs, at the top or inside a function
    (``if TYPE_CHECKING:`` blocks, which never run, excepted)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                   for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in known and name != "scaledl"}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import one another (strongly connected, more than one)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in edges[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in edges:
        if module not in order:
            visit(module)
    return found


def test_no_modules_import_each_other() -> None:
    """design.md: no two files import each other, directly or around a circle, even inside a
    function."""
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    known = set(paths)
    edges = {name: _runtime_imports(path, known) - {name} for name, path in paths.items()}
    edges["scaledl.cli.main"] |= set(COMMANDS.values())  # imported by name, on demand
    assert _cycles(edges) == []


def test_the_circle_check_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
