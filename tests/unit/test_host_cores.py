"""``host_cores``: the cores a host's ranks may run on together (the union of their
affinities, so ranks bound to a core each still count a core each), capped by the cgroup's CPU
quota; what the shared-memory waits decide to spin on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaledl import topology
from scaledl.topology import _cfs_quota, _cpu_max, host_cores
from scaledl.transport.shm import SPINS, spins_for


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_ranks_bound_to_a_core_each_count_every_core_they_hold() -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
                for _ in range(2)]
    try:
        os.sched_setaffinity(children[0].pid, {first})
        os.sched_setaffinity(children[1].pid, {second})
        assert host_cores([children[0].pid]) == 1
        assert host_cores(child.pid for child in children) == 2
        assert spins_for(2, host_cores(child.pid for child in children)) == SPINS
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_process_that_is_gone_counts_as_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "_cgroup_cpus", lambda: None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert host_cores([child.pid]) == (os.cpu_count() or 1)


def test_the_cgroup_quota_caps_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "_cgroup_cpus", lambda: 1)
    assert host_cores() == 1


def test_cgroup_quotas_are_read_in_whole_cores(tmp_path: Path) -> None:
    assert _cpu_max("max 100000\n", tmp_path) is None
    assert _cpu_max("200000 100000\n", tmp_path) == 2
    assert _cpu_max("150000 100000\n", tmp_path) == 2  # 1.5 cores: both are used in turn
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert _cfs_quota("-1\n", tmp_path / "cpu.cfs_quota_us") is None
    assert _cfs_quota("400000\n", tmp_path / "cpu.cfs_quota_us") == 4
