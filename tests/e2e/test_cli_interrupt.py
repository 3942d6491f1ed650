"""Ctrl-C at any moment of ``scaledl``'s start prints one line and exits 130: ``import scaledl``
and the console script's module load no torch, so the interrupt lands inside ``main``."""

from __future__ import annotations

import builtins
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers_imports import modules_loaded_by


@pytest.mark.parametrize("statement", ["import scaledl", "import scaledl.cli.main"])
def test_the_package_and_the_console_script_load_no_torch(statement: str) -> None:
    assert modules_loaded_by(statement, ("torch",)) == []


def test_the_public_names_load_on_first_use() -> None:
    import scaledl
    from scaledl.collectives import allreduce
    from scaledl.topology import Topology

    assert scaledl.allreduce is allreduce and scaledl.Topology is Topology
    assert {"init", "allreduce", "DataParallel"} <= set(dir(scaledl))
    with pytest.raises(AttributeError, match="has no attribute 'nosuch'"):
        scaledl.nosuch  # noqa: B018


def test_an_interrupt_while_the_subcommands_load_is_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from scaledl.cli.main import main

    real = builtins.__import__

    def interrupted(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "scaledl.bootstrap":
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert main(["simulate", "--gpus", "8"]) == 130
    assert capsys.readouterr().err == "scaledl: interrupted\n"


def _loading_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc")
def test_ctrl_c_while_torch_loads_prints_no_traceback() -> None:
    """SIGINT once the process maps torch's library, i.e. inside ``import torch``."""
    job = subprocess.Popen([sys.executable, "-m", "scaledl.cli.main", "simulate", "--gpus", "8"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "SCALEDL_DEBUG": ""})
    deadline = time.monotonic() + 60
    while not _loading_torch(job.pid) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    job.send_signal(signal.SIGINT)
    out, err = job.communicate(timeout=60)
    assert job.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().endswith("scaledl: interrupted")


def test_torchs_info_lines_are_not_shown() -> None:
    """torch logs cache statistics at INFO when it exits (seen after a Ctrl-C), meant for its
    developers; rank 0's INFO level would print them."""
    import logging

    from scaledl.cli.logs import configure_logging

    configure_logging(0)
    assert not logging.getLogger("torch._subclasses.fake_tensor").isEnabledFor(logging.INFO)
    assert logging.getLogger("scaledl.cli.train").isEnabledFor(logging.INFO)
