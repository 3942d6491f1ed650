"""Local workers get a temporary directory of their own, removed however they end.

torch 2.8 creates a directory in ``TMPDIR`` when a worker builds its first optimizer, and a
worker killed by a signal never removes it: ``tests/e2e/test_train_faults.py`` found one left
behind by every killed worker there.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scaledl.launch import local as launch
from scaledl.launch.local import worker_scratch
from scaledl.launch.policy import FaultPolicy, JobOutcome

LEAVE_AND_DIE = (
    "import os, signal, tempfile; d = tempfile.mkdtemp(); open(os.path.join(d, 'f'), 'w')"
    ".write('x'); print(d, flush=True); os.kill(os.getpid(), signal.SIGKILL)"
)


def test_a_killed_workers_files_are_removed(tmp_path: Path) -> None:
    with worker_scratch({"TMPDIR": str(tmp_path)}) as env:
        done = subprocess.run([sys.executable, "-c", LEAVE_AND_DIE], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == -signal.SIGKILL
        left = Path(done.stdout.strip())
        assert left.parent == Path(env["TMPDIR"]) and (left / "f").exists()
    assert not left.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_scratch_is_inside_the_callers_tmpdir_and_keeps_other_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with worker_scratch({"TMPDIR": str(tmp_path), "A": "1"}) as env:
        assert Path(env["TMPDIR"]).parent == tmp_path
        assert Path(env["TMPDIR"]).name.startswith("scaledl-workers-")
        assert env["A"] == "1"
        assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == tmp_path  # outlives the run
        assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).name.startswith("torchinductor_")


def test_a_compile_cache_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/cache")
    with worker_scratch(None) as env:
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/cache"


def _no_user_name() -> str:
    raise KeyError("getpwuid(): uid not found")


@pytest.mark.parametrize("unnamed", [False, True], ids=["named user", "no user name"])
def test_the_compile_cache_is_named_as_torch_names_it(
    monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    """``_user`` repeats torch's rule (whose module costs a second to import at launch)."""
    cache_dir_utils = pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    if unnamed:
        monkeypatch.setattr("getpass.getuser", _no_user_name)
    try:
        torch_name = Path(cache_dir_utils.default_cache_dir()).name
    except KeyError:
        pytest.skip("this torch has no name for a user it cannot look up (torch 2.8 has none)")
    assert f"torchinductor_{launch._user()}" == torch_name


@pytest.mark.parametrize("policy", [FaultPolicy(), FaultPolicy(drop_dead_workers=True)])
def test_launch_local_hands_the_workers_a_scratch_it_removes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policy: FaultPolicy
) -> None:
    seen: dict[str, str] = {}

    def fake(*args: Any) -> JobOutcome:
        env = args[-1]
        seen.update(env)
        assert Path(env["TMPDIR"]).is_dir()
        return JobOutcome(0)

    monkeypatch.setattr(launch, "run_agent", fake)
    monkeypatch.setattr(launch, "launch_agents", fake)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    assert launch.launch_local(2, ["train"], {"X": "1"}, policy).code == 0
    assert seen["X"] == "1" and Path(seen["TMPDIR"]).parent == tmp_path
    assert not Path(seen["TMPDIR"]).exists()
