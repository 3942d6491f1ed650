"""Run Horovod's own ``test/parallel/test_torch.py`` against ``scaledl.horovod``.

Usage::

    python benchmarks/horovod/run_suite.py PATH [--ranks 2] [--timeout 1800] [-k EXPR]

``PATH`` is a Horovod checkout (a work tree, or a bare git mirror whose HEAD is read with
``git show``) or an extracted ``test_torch.py``. Nothing is downloaded. The script:

1. copies the test file into a temporary directory (never into this repository);
2. writes a shim package there, ``horovod/torch.py``, that makes ``import horovod.torch as hvd``
   return ``scaledl.horovod``, and a small ``common.py`` with the three helpers the file imports
   from Horovod's ``test/utils`` (Horovod's own one needs Horovod's runner, cloudpickle and mock);
3. runs the whole file in one pytest process per rank under Open MPI's ``mpirun``, each rank
   writing a JUnit XML report;
4. merges the reports (a test passes when it passed on every rank, fails when it failed or errored
   on any rank, is skipped otherwise) and prints the counts and the failing tests.

``--gloo-env`` also sets ``HOROVOD_RANK`` on every rank, as ``horovodrun`` does in its Gloo mode:
two tests (``test_horovod_reinit``, ``test_horovod_is_initialized``) check shutdown and re-init
only then, and skip under MPI because Horovod over MPI cannot initialize twice.

Tests that build torch's Muon optimizer (``test_broadcast_state*``, ``test_force_allreduce``) are
counted apart as "excluded": torch 2.13's Muon refuses 1-D parameters, so they fail under Horovod
itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

TEST_PATH = "test/parallel/test_torch.py"
EXCLUDED_PREFIXES = ("test_broadcast_state", "test_force_allreduce")

SHIM = '''"""Test-only stand-in: ``horovod.torch`` is ``scaledl.horovod``."""
import sys

import scaledl.horovod

sys.modules[__name__] = scaledl.horovod
'''

COMMON = '''"""The helpers test_torch.py imports from Horovod's test/utils, written here."""
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    """(rank, size) from Open MPI's or MPICH's variables, or (0, 1) outside a launcher."""
    for rank_name, size_name in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                                 ("PMI_RANK", "PMI_SIZE")):
        if rank_name in os.environ and size_name in os.environ:
            return int(os.environ[rank_name]), int(os.environ[size_name])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    """Skip a GPU test, or fail it where the environment says GPUs are required."""
    if os.environ.get("HOROVOD_TEST_GPU", "0") == "1":
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    """A path for a file that is removed afterwards."""
    handle, path = tempfile.mkstemp()
    os.close(handle)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
'''


def read_test_file(source: Path) -> str:
    """The text of test_torch.py from a file, a checkout or a bare git mirror."""
    if source.is_file():
        return source.read_text()
    if (source / TEST_PATH).is_file():
        return (source / TEST_PATH).read_text()
    shown = subprocess.run(["git", "-C", str(source), "show", f"HEAD:{TEST_PATH}"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        sys.exit(f"{source} is neither test_torch.py nor a Horovod checkout holding {TEST_PATH}: "
                 f"{shown.stderr.strip()}")
    return shown.stdout


def free_port() -> int:
    """A TCP port nobody listens on now, for the rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prepare(work: Path, text: str) -> Path:
    """Lay out test/parallel/test_torch.py, test/utils/common.py and the shim under ``work``."""
    parallel = work / "test" / "parallel"
    utils = work / "test" / "utils"
    shim = work / "shim" / "horovod"
    for folder in (parallel, utils, shim):
        folder.mkdir(parents=True, exist_ok=True)
    (parallel / "test_torch.py").write_text(text)
    (utils / "common.py").write_text(COMMON)
    (shim / "__init__.py").write_text('"""Test-only stand-in package for Horovod."""\n')
    (shim / "torch.py").write_text(SHIM)
    return parallel / "test_torch.py"


def run(test_file: Path, work: Path, ranks: int, timeout: float, select: str | None,
        gloo_env: bool) -> int:
    """Run the file under mpirun, one JUnit report per rank; the launcher's exit code."""
    mpirun = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found: install Open MPI (apt-get install -y openmpi-bin)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(work / "shim"), str(test_file.parent.parent / "utils"), env.get("PYTHONPATH", "")])
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())
    env.setdefault("OMP_NUM_THREADS", "1")
    pytest_args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "-o", "addopts=", str(test_file)]
    if select:
        pytest_args += ["-k", select]
    # The shell expands the rank per process, so each rank writes its own report.
    per_rank = "HOROVOD_RANK=$OMPI_COMM_WORLD_RANK exec " if gloo_env else "exec "
    per_rank += " ".join(f"'{arg}'" for arg in pytest_args)
    per_rank += f" --junitxml='{work}/rank'$OMPI_COMM_WORLD_RANK.xml"
    command = [mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    for name in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        command += ["-x", name]
    command += ["sh", "-c", per_rank]
    try:
        return subprocess.run(command, env=env, cwd=work, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"mpirun ran past {timeout:.0f} s and was stopped; counting the reports written",
              file=sys.stderr)
        return 124


def outcomes(report: Path) -> dict[str, str]:
    """test name -> passed / failed / skipped, from one rank's JUnit report."""
    result: dict[str, str] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        elif case.find("skipped") is not None:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


def merge(reports: list[dict[str, str]]) -> dict[str, str]:
    """One verdict per test over all ranks."""
    merged: dict[str, str] = {}
    for name in sorted(set().union(*reports)):
        seen = {report.get(name, "failed") for report in reports}
        if "failed" in seen:
            merged[name] = "failed"
        elif seen == {"passed"}:
            merged[name] = "passed"
        else:
            merged[name] = "skipped"
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="Horovod checkout, bare mirror or test_torch.py")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    parser.add_argument("-k", dest="select", help="pytest -k expression (a subset)")
    parser.add_argument("--gloo-env", action="store_true",
                        help="set HOROVOD_RANK as horovodrun's Gloo mode does")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scaledl-hvd-suite-"))
    try:
        test_file = prepare(work, read_test_file(args.source))
        code = run(test_file, work, args.ranks, args.timeout, args.select, args.gloo_env)
        paths = [work / f"rank{rank}.xml" for rank in range(args.ranks)]
        missing = [str(path.name) for path in paths if not path.exists()]
        if missing:
            print(f"no report from {', '.join(missing)} (mpirun exit code {code})")
            return 1
        merged = merge([outcomes(path) for path in paths])
        excluded = {n for n in merged if n.startswith(EXCLUDED_PREFIXES)}
        counted = {n: v for n, v in merged.items() if n not in excluded}
        counts = {v: sum(1 for x in counted.values() if x == v)
                  for v in ("passed", "failed", "skipped")}
        for name, verdict in sorted(counted.items()):
            if verdict != "passed":
                print(f"{verdict:8} {name}")
        print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
              f"of {len(counted)} tests on {args.ranks} ranks ({len(excluded)} excluded: "
              f"{', '.join(sorted(excluded))})")
        return 0 if counts["failed"] == 0 else 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
