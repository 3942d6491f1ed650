"""Shared pytest configuration (``tests`` is a package, so its helpers import as ``tests.*``).

The suite checks the host-memory paths (Gloo, shared memory, models on the CPU) and must give
the same answers on a GPU workstation as on CI's CPU-only machine.  So CUDA is hidden from this
process and every process it starts: ``scaledl.init()`` then defaults to Gloo, as the tests'
CPU tensors need, and ``scaledl simulate profile`` measures the CPU.  On a lent H100 the suite
without this failed in every test whose ranks share one host (NCCL gives each rank its own GPU).
The CUDA checks are ``benchmarks/device/check.sh``.
"""

import os
import signal

import pytest

os.environ["CUDA_VISIBLE_DEVICES"] = ""

FAILURE_LOG = "SCALEDL_FAILURE_LOG"
"""A file to which each failure's report is appended as it happens (``benchmarks/device/check.sh``
sets it): a run that a deadline stops keeps the tracebacks pytest would have printed at its end."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append a failed test's report to ``$SCALEDL_FAILURE_LOG`` when that is set (under xdist
    the controller sees every worker's reports, so one process writes the file)."""
    path = os.environ.get(FAILURE_LOG)
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n"
                  f"{report.capstderr[-4000:]}\n")


def pytest_configure(config: pytest.Config) -> None:
    """Take Ctrl-C as a terminal gives it, even when a shell started the suite in the background:
    a non-interactive shell starts an asynchronous command (``cmd &``) with SIGINT ignored, every
    process the tests start inherits that, and the tests of what Ctrl-C does (to the CLI, to a
    cluster, to this process) then see nothing happen."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
